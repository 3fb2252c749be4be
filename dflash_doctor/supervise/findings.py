"""Per-process records -> findings (rules/live.py, DFD9xx). Pure: the rules' JSON examples go through exactly this.

One finding per root cause: a thread's first FX-tracing error (later raises of the same thread are counted in
its evidence), and each process's hang. The next step comes from the mitigation registry for the torch that
process imported, and says which `--fix` would prove it in the same command.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dflash_doctor import mitigations as registry
from dflash_doctor.dataparallel import FIXES as DATAPARALLEL_FIXES
from dflash_doctor.findings import Finding
from dflash_doctor.hazards import Hazard, Release
from dflash_doctor.outcomes import BlameKind, HangCycle
from dflash_doctor.rules import live as rules
from dflash_doctor.runtime.fx_patches import is_patcher_error
from dflash_doctor.runtime.recorder import FX_ERROR_PREFIX, CompileStart, recompile_signs
from dflash_doctor.runtime.stacks import Frame
from dflash_doctor.runtime.thread_roles import is_replica_reraise, role_of
from dflash_doctor.supervise.records import BlameRecord, DeathRecord, ProcessRecord
from dflash_doctor.supervise.setting_gaps import setting_gap_findings

STACK_FRAMES = 12  # frames of a holder's stack kept in a finding's evidence (innermost)


def release_of(record: ProcessRecord) -> Release:
    return Release(version=record.torch_version, fx_flag_thread_local=record.fx_flag_thread_local)


def next_steps(hazard: Hazard, record: ProcessRecord) -> List[str]:
    """The registry's best complete fix for this process's torch, as a list a person reads one item at a time:
    the `--fix` that proves it in the same command when every part applies without a code change, the trainer
    code, what is already applied, the alternatives."""
    release = release_of(record)
    needed = {hazard} | {h for h in release.hazards() if not h.minor}
    ranked = [r for r in registry.recommend(needed, release) if r.complete]
    if not ranked:
        return [registry.fix_text(hazard, release=release)]
    best = ranked[0]
    applied = [name for name in best.mitigations if name in record.fixes]
    parts = [registry.get(name) for name in best.mitigations]
    code = "; ".join(best.api)
    steps = []
    if all(part.applies_without_code_change for part in parts):
        steps.append(f"prove it: rerun the same command under `dflash-doctor run --fix {best.label} -- ...`")
        steps.append(f"then put it in your trainer: {code}")
    else:
        steps.append(f"apply {best.label} in your trainer: {code}")
    if applied:
        steps.append(f"already applied here: {', '.join(applied)}; what it leaves open: "
                     f"{'; '.join(registry.caveats_for(record.fixes)) or 'nothing listed'}")
    others = [r.label for r in ranked[1:]]
    if others:
        steps.append(f"alternatives: {'; '.join(others)}")
    return steps


def next_step(hazard: Hazard, record: ProcessRecord) -> str:
    """`next_steps` as one line (the evidence's `next`, for tools that read one string)."""
    return "; ".join(next_steps(hazard, record))


_TOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))).replace("\\", "/") + "/"


def _own_frame(frames: Sequence[Frame]) -> Optional[Frame]:
    """The innermost frame of the user's code: not the standard library's (an Event's wait), not torch's, not a
    package's, and not this tool's own (the recorder's wrapper around Tracer.trace, the fixes' shims)."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"].replace("\\", "/")
    for frame in reversed(frames):
        path = frame.file.replace("\\", "/")
        if path.startswith("<"):  # '<string>' (an exec, Dynamo's guard evaluation), '<frozen ...>'
            continue
        if path.startswith(_TOOL_DIR):
            continue
        if not path.startswith(stdlib) and "/torch/" not in path and "site-packages" not in path:
            return frame
    return None


def _location(frame: Optional[Frame]) -> Dict[str, Any]:
    """A frame as a finding's location: a stack names a line, not a column, so the column is the line's first."""
    return {"path": frame.file, "line": frame.line, "column": 1} if frame is not None else {}


def _short(frame: Optional[Frame]) -> str:
    """`train.py:40` (the file's name and line): the message's way to say where; the path is the location's."""
    return f"{os.path.basename(frame.file)}:{frame.line}" if frame is not None else "a line not captured"


def _line_of(frame: Optional[Frame]) -> str:
    if frame is None:
        return "a line not captured"
    return f"{frame.where()}" + (f": {frame.source}" if frame.source else "")


def _where(frames: Sequence[Frame]) -> List[str]:
    return [frame.where() + (f": {frame.source}" if frame.source else "") for frame in frames[-STACK_FRAMES:]]


def _base(record: ProcessRecord) -> Dict[str, object]:
    return {"pid": record.pid, "rank": record.rank, "argv": list(record.argv), "torch": record.torch_version,
            "fixes": list(record.fixes)}


def _fx_findings(record: ProcessRecord) -> List[Finding]:
    firsts: Dict[str, Tuple[BlameRecord, int]] = {}
    for blame in record.blames:
        first, count = firsts.get(blame.victim, (blame, 0))
        # The raise itself is blamed at once; if the error then escapes the thread, its excepthook blames it again
        # later, when the holder may be gone: the first, with a holder, is the one that says who.
        if first.holder is None and blame.holder is not None:
            first = blame
        firsts[blame.victim] = (first, count + 1)
    return [_fx_finding(record, blame, count) for blame, count in firsts.values()]


def _fx_finding(record: ProcessRecord, blame: BlameRecord, count: int) -> Finding:
    victim = blame.victim
    # the holder's own line that started its trace, read from the stack it had when the trace began
    started = _trace_entry(blame.trace_start) if blame.trace_start else _trace_entry(blame.holder_stack)
    if blame.kind is BlameKind.STUCK_FLAG:
        blame_line = f"{blame.holder}, whose trace exit left the FX flag stuck (it restored a stale True)"
        hazard = Hazard.STUCK_FLAG
    elif blame.holder is not None and blame.kind is BlameKind.FX_FLAG_LEAK:
        blame_line = f"{blame.holder}, inside an FX trace begun at {_short(started)}"
        hazard = Hazard.FX_FLAG_LEAK
    elif blame.kind is BlameKind.NESTED_TRACE:
        blame_line = f"{victim} itself, inside an FX trace (a compiled call under symbolic_trace)"
        hazard = Hazard.FX_FLAG_LEAK
    else:
        blame_line = "no thread was inside an FX trace at that moment (the flag was already stuck?)"
        hazard = Hazard.STUCK_FLAG
    steps = next_steps(hazard, record)
    victim_at = _own_frame(blame.victim_stack)
    message = (f"{victim} raised the FX-tracing RuntimeError at {blame.at_s:.1f} s ({record.label}); "
               f"to blame: {blame_line}")
    details = [f"victim: {victim} at {_line_of(victim_at)}",
               f"to blame: {blame.holder or 'unknown'}; its trace began at {_line_of(started)}"]
    if count > 1:
        details.append(f"raised {count} times in {victim}")
    evidence = {**_base(record), "worker": victim, "holder": blame.holder, "blame_kind": blame.kind.value,
                "at_s": blame.at_s, "raised": count, "holder_stack": _where(blame.holder_stack),
                "trace_start": _where(blame.trace_start), "victim_stack": _where(blame.victim_stack),
                "victim_at": _line_of(victim_at), "details": details, "next": "; ".join(steps), "next_steps": steps}
    # SARIF points at the line to change: the holder's, else the victim's own
    return rules.RUN_FX_FLAG_ERROR.finding(message, evidence=evidence, **_location(started or victim_at))


def _hang_finding(record: ProcessRecord) -> Optional[Finding]:
    hang = record.hang
    if hang is None:
        return None
    diagnosis = hang.diagnosis
    threads = ", ".join(diagnosis.threads)
    if diagnosis.cycle == HangCycle.COMPILE_LOCK_AUTOGRAD:
        rule, steps = rules.LIVE_COMPILE_DEADLOCK, next_steps(Hazard.DEADLOCK, record)
        what = f"threads {threads} deadlocked on compile_lock and the autograd device thread"
    elif diagnosis.cycle == HangCycle.LOCK_CYCLE:
        rule, steps = rules.LIVE_LOCK_DEADLOCK, [rules.LIVE_LOCK_DEADLOCK.fix]
        what = f"threads {threads} wait on each other's locks"
    elif diagnosis.cycle == HangCycle.LOCK_WAIT:  # queued behind holders that wait for none of their locks: no cycle
        rule, steps = rules.LIVE_NO_PROGRESS, [rules.LIVE_NO_PROGRESS.fix]
        what = (f"no progress for {diagnosis.stalled_s:.0f} s; threads {threads} wait for locks whose holders "
                "wait for none of theirs")
    else:
        rule, steps = rules.LIVE_NO_PROGRESS, [rules.LIVE_NO_PROGRESS.fix]
        what = f"no progress for {diagnosis.stalled_s:.0f} s and no lock cycle in the stacks"
    latency = hang.latency_s
    message = f"{what} ({record.label}, found at {hang.detected_at_s:.1f} s)"
    involved = [stack for stack in hang.stacks if stack.name in diagnosis.threads] or list(hang.stacks)
    evidence = {**_base(record), "cycle": diagnosis.cycle, "threads": list(diagnosis.threads),
                "chain": list(diagnosis.chain), "detected_at_s": hang.detected_at_s,
                "last_clear_sample_at_s": hang.last_clear_sample_at_s, "latency_s": latency,
                "last_event_at_s": hang.last_event_at_s, "locks": list(diagnosis.locks),
                "stacks": {stack.name: _where(stack.frames) for stack in involved},
                "details": list(diagnosis.chain), "next": "; ".join(steps), "next_steps": steps}
    first = next((stack for stack in involved if stack.name in diagnosis.threads[:1]), None)
    own = _own_frame(first.frames) if first is not None else None
    return rule.finding(message, evidence=evidence, **_location(own))


def _trace_entry(frames: Sequence[Frame]) -> Optional[Frame]:
    """Where the tracing thread's code called into torch.fx (its symbolic_trace or Tracer().trace line): the
    line to change. The innermost user frame would be a module's forward, run by the trace."""
    for index, frame in enumerate(frames):
        if "/torch/fx/" in frame.file.replace("\\", "/"):
            return _own_frame(frames[:index])
    return _own_frame(frames)


def _death_finding(record: ProcessRecord, death: DeathRecord) -> Finding:
    raised = _own_frame(death.raised_at)
    evidence = {**_base(record), "worker": death.thread, "error_type": death.error_type, "error": death.error,
                "at_s": death.at_s, "traceback": _where(death.raised_at), "tracing": list(death.tracing),
                "tracing_stack": _where(death.tracing_stack), "last_tracer": death.last_tracer}
    said = f"{death.error_type}: {death.error.splitlines()[0] if death.error else ''}"
    victim = f"victim: {death.thread} at {_line_of(raised)}"
    if death.patcher_race:
        steps = next_steps(Hazard.PATCHER_RACE, record)
        entry = _trace_entry(death.tracing_stack)
        if death.tracing:
            tracer = ", ".join(death.tracing)
            blame = f"to blame: {tracer}, inside an FX trace begun at {_line_of(entry)}"
        elif death.last_tracer == death.thread:
            tracer = f"{death.thread} itself"
            blame = (f"to blame: its own last FX trace, begun at {_line_of(entry)}, ended at "
                     f"{death.last_trace_at_s:.1f} s: a thread it waited on met that trace's patches and the "
                     "error was re-raised here")
        elif death.last_tracer is not None:
            tracer = death.last_tracer
            blame = (f"to blame: {death.last_tracer}, whose FX trace (begun at {_line_of(entry)}) ended at "
                     f"{death.last_trace_at_s:.1f} s; no other thread traced at that moment")
        else:
            tracer = "unknown"
            blame = "to blame: no other thread was inside an FX trace when it died (the trace that patched it ended)"
        how = [] if is_patcher_error(death.error) else \
            ["how: a Dynamo guard broke while torch.fx's patches swapped nn.Module.__call__ under the compile"]
        reraised = " (re-raised here)" if death.last_tracer == death.thread and not death.tracing else ""
        message = (f"{death.thread} died of the FX patcher race at {death.at_s:.1f} s ({record.label}): "
                   f"{death.error_type}{reraised}; to blame: {tracer}, tracing from {_short(entry)}")
        details = [victim, f"error: {said}"[:300], blame, *how]
        # SARIF points at the tracing thread's line when there is one: that is the line to change
        return rules.RUN_PATCHER_RACE.finding(message, evidence={
            **evidence, "details": details, "next": "; ".join(steps), "next_steps": steps},
            **_location(entry or raised))
    # a DataParallel replica does not die: parallel_apply catches its error and re-raises it in the caller
    ended = "failed" if death.thread.startswith("replica ") else "died"
    message = f"{death.thread} {ended} at {death.at_s:.1f} s ({record.label}): {said}"
    steps = [rules.RUN_THREAD_DIED.fix]
    return rules.RUN_THREAD_DIED.finding(message[:300], evidence={
        **evidence, "details": [victim, f"error: {said}"[:300]], "next_steps": steps}, **_location(raised))


def _death_findings(record: ProcessRecord) -> List[Finding]:
    """One finding per death, each once. A death that is the FX-tracing RuntimeError DFD901 already blamed for that
    thread is that finding; any other death of the same thread (the patcher race later in the same run) is its
    own (the de-duplication is by thread and error, not by thread). The replicas of a compiled module that
    nn.DataParallel ran are one finding for the process: every step fails the same way, for one reason."""
    blamed = {blame.victim for blame in record.blames}
    replicated = [death for death in record.deaths if death.replicated_compiled]
    # the caller's death by DataParallel's re-raise of such a replica's error is that error, said once
    folded = [death for death in record.deaths
              if death.replicated_compiled or (replicated and is_replica_reraise(death.error))]
    found = [_death_finding(record, death) for death in record.deaths
             if death not in folded and not (death.thread in blamed and death.error.startswith(FX_ERROR_PREFIX))]
    return ([_replicated_compiled_finding(record, replicated, folded)] if replicated else []) + found


def _replicated_compiled_finding(record: ProcessRecord, deaths: Sequence[DeathRecord],
                                 folded: Sequence[DeathRecord]) -> Finding:
    first = deaths[0]
    reraised_in = sorted({death.thread for death in folded if not death.replicated_compiled})
    raised = _own_frame(first.raised_at)
    replicas = sorted({role_of(death.thread) for death in deaths})
    said = f"{first.error_type}: {first.error.splitlines()[0] if first.error else ''}"
    message = (f"nn.DataParallel ran replicas of a torch.compile'd module and they failed {len(deaths)} time(s) from "
               f"{first.at_s:.1f} s ({record.label}): {said}"[:300])
    steps = [f"{fix.name}: {fix.api}" for fix in DATAPARALLEL_FIXES] + [
        "dflash-doctor repro --mode dataparallel: each form on this machine"]
    details = [f"replicas: {', '.join(replicas)}", f"first: {first.thread} at {_line_of(raised)}",
               f"error: {said}"[:300],
               "why: replicating an OptimizedModule writes the copy's empty parameters and submodules through to "
               "your own model (not a thread race; no thread fix helps)"]
    evidence = {**_base(record), "worker": first.thread, "error_type": first.error_type, "error": first.error,
                "at_s": first.at_s, "traceback": _where(first.raised_at), "failures": len(deaths),
                "replicas": replicas, "reraised_in": reraised_in, "details": details, "next": "; ".join(steps),
                "next_steps": steps}
    return rules.RUN_DATAPARALLEL_COMPILED.finding(message, evidence=evidence, **_location(raised))


def _recompile_finding(record: ProcessRecord) -> Optional[Finding]:
    """Threads racing on one compiled function's first calls: the same frame compiled by two or more threads
    with recompiles whose guards 'passed', or the recompile limit hit outside the main thread."""
    signs = recompile_signs(record.events)
    worker_hits = [(thread, at) for thread, at in signs.limit_hits if thread != "MainThread"]
    if not signs.guards_passed and not worker_hits:
        return None
    by_frame: Dict[str, List[CompileStart]] = {}
    for start in signs.compiles:
        by_frame.setdefault(start.frame, []).append(start)
    racing = [starts for starts in by_frame.values() if len({s.thread for s in starts}) >= 2]
    if not racing and not worker_hits:
        return None
    starts = max(racing, key=len) if racing else []
    compilers = sorted({s.thread for s in starts}, key=_natural)
    threads = sorted(set(compilers) | {t for t, _ in signs.guards_passed} | {t for t, _ in worker_hits},
                     key=_natural)
    span = (starts[-1].t - starts[0].t) if starts else 0.0
    parts = [f"{len(starts)} compiles of one function by {len(compilers)} threads in {span:.1f} s"] if starts else []
    if signs.guards_passed:
        parts.append(f"{len(signs.guards_passed)} recompiles whose guards 'passed'")
    if worker_hits:
        hit = sorted({t for t, _ in worker_hits}, key=_natural)
        parts.append(f"the recompile limit hit in {len(hit)} thread(s): {_listed(hit, 3)} (that function now runs "
                     "uncompiled)")
    message = f"threads raced to compile the same function ({record.label}): " + "; ".join(parts)
    caller = next((s.caller for s in starts if s.caller is not None), None)
    details = [f"threads: {_listed(threads)}",
               f"first compile: {starts[0].thread} at {_line_of(caller)}" if starts else "first compile: not seen"]
    if signs.guards_passed:
        details.append(f"Dynamo said: {signs.guards_passed[0][1].split(': ', 1)[-1][:160]}")
    steps = [rules.RUN_RECOMPILE_RACE.fix]
    evidence = {**_base(record), "threads": threads, "compilers": compilers, "compiles": len(starts),
                "guards_passed": len(signs.guards_passed), "limit_hit_in": [t for t, _ in worker_hits],
                "details": details, "next": steps[0], "next_steps": steps}
    return rules.RUN_RECOMPILE_RACE.finding(message, evidence=evidence, **_location(caller))


def _natural(name: str) -> Tuple[str, int]:
    """worker-2 before worker-10."""
    head = name.rstrip("0123456789")
    tail = name[len(head):]
    return head, int(tail) if tail else -1


def _listed(names: Sequence[str], most: int = 8) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def findings_from_records(records: Sequence[ProcessRecord]) -> List[Finding]:
    findings: List[Finding] = []
    for record in records:
        findings.extend(_fx_findings(record))
        findings.extend(_death_findings(record))
        recompiles = _recompile_finding(record)
        if recompiles is not None:
            findings.append(recompiles)
        findings.extend(setting_gap_findings(record))
        hang = _hang_finding(record)
        if hang is not None:
            findings.append(hang)
    return findings


def example_findings(text: str) -> List[Finding]:
    """A live facts rule example's findings (rule_examples.py EXAMPLE_RUNNERS)."""
    import json

    return findings_from_records([ProcessRecord.from_dict(p) for p in json.loads(text)["processes"]])

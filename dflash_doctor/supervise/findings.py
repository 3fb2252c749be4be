"""Per-process records -> findings (rules/live.py, DFD9xx). Pure: the rules' JSON examples go through exactly this.

One finding per root cause: a thread's first FX-tracing error (later raises of the same thread are counted in
its evidence), and each process's hang. The next step comes from the mitigation registry for the torch that
process imported, and says which `--fix` would prove it in the same command.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from dflash_doctor import mitigations as registry
from dflash_doctor.findings import Finding
from dflash_doctor.hazards import Hazard, Release
from dflash_doctor.outcomes import BlameKind
from dflash_doctor.rules import live as rules
from dflash_doctor.runtime.deadlock import DYNAMO_CYCLE, LOCK_CYCLE, LOCK_WAIT
from dflash_doctor.runtime.fx_patches import is_patcher_error
from dflash_doctor.runtime.stacks import Frame
from dflash_doctor.supervise.records import BlameRecord, DeathRecord, ProcessRecord

STACK_FRAMES = 12  # frames of a holder's stack kept in a finding's evidence (innermost)


def release_of(record: ProcessRecord) -> Release:
    return Release(version=record.torch_version, fx_flag_thread_local=record.fx_flag_thread_local)


def next_step(hazard: Hazard, record: ProcessRecord) -> str:
    """The registry's best complete fix for this process's torch, phrased as the `--fix` that proves it in the
    same command when every part applies without a code change, and as trainer code otherwise."""
    release = release_of(record)
    needed = {hazard} | {h for h in release.hazards() if not h.minor}
    ranked = [r for r in registry.recommend(needed, release) if r.complete]
    if not ranked:
        return registry.fix_text(hazard, release=release)
    best = ranked[0]
    applied = [name for name in best.mitigations if name in record.fixes]
    parts = [registry.get(name) for name in best.mitigations]
    code = "; ".join(best.api)
    if all(part.applies_without_code_change for part in parts):
        text = f"rerun the same command under `dflash-doctor run --fix {best.label} -- ...` to prove it, then " \
               f"put it in your trainer: {code}"
    else:
        text = f"apply {best.label} in your trainer: {code}"
    if applied:
        text += f" (already applied here: {', '.join(applied)}; what it leaves open: " \
                f"{'; '.join(registry.caveats_for(record.fixes)) or 'nothing listed'})"
    others = [r.label for r in ranked[1:]]
    return text + (f"; alternatives: {', '.join(others)}" if others else "")


def _own_frame(frames: Sequence[Frame]) -> Optional[Frame]:
    """The innermost frame of the user's code: not the standard library's (an Event's wait), not torch's."""
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"].replace("\\", "/")
    for frame in reversed(frames):
        path = frame.file.replace("\\", "/")
        if path.startswith("<"):  # '<string>' (an exec, Dynamo's guard evaluation), '<frozen ...>'
            continue
        if not path.startswith(stdlib) and "/torch/" not in path and "site-packages" not in path:
            return frame
    return frames[-1] if frames else None


def _location(frame: Optional[Frame]) -> Dict[str, Any]:
    """A frame as a finding's location: a stack names a line, not a column, so the column is the line's first."""
    return {"path": frame.file, "line": frame.line, "column": 1} if frame is not None else {}


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
    findings = []
    for victim, (blame, count) in firsts.items():
        if blame.kind is BlameKind.STUCK_FLAG:
            held = f"the flag was left stuck by {blame.holder}, whose trace exit restored a stale True"
            hazard = Hazard.STUCK_FLAG
        elif blame.holder is not None and blame.kind is BlameKind.FX_FLAG_LEAK:
            own = _own_frame(blame.holder_stack)
            inner = own.where() if own is not None else "a frame not captured"
            held = f"{blame.holder} held the flag, inside an FX trace at {inner}"
            hazard = Hazard.FX_FLAG_LEAK
        elif blame.kind is BlameKind.NESTED_TRACE:
            held = f"{victim} was itself inside an FX trace (a compiled call under symbolic_trace)"
            hazard = Hazard.FX_FLAG_LEAK
        else:
            held = "no thread was inside an FX trace at that moment (the flag was already stuck?)"
            hazard = Hazard.STUCK_FLAG
        step = next_step(hazard, record)
        message = (f"{victim} ({record.label}) raised the FX-tracing RuntimeError at {blame.at_s:.1f} s; {held}. "
                   f"Next: {step}")
        evidence = {**_base(record), "worker": victim, "holder": blame.holder, "blame_kind": blame.kind.value,
                    "at_s": blame.at_s, "raised": count, "holder_stack": _where(blame.holder_stack), "next": step}
        own = _own_frame(blame.holder_stack)  # where the holder's trace started in the user's code, for SARIF
        findings.append(rules.RUN_FX_FLAG_ERROR.finding(message, evidence=evidence, **_location(own)))
    return findings


def _hang_finding(record: ProcessRecord) -> Optional[Finding]:
    hang = record.hang
    if hang is None:
        return None
    diagnosis = hang.diagnosis
    threads = ", ".join(diagnosis.threads)
    if diagnosis.cycle == DYNAMO_CYCLE:
        rule, step = rules.LIVE_COMPILE_DEADLOCK, next_step(Hazard.DEADLOCK, record)
        what = f"threads {threads} deadlocked: compile_lock -> autograd device thread -> compile_lock"
    elif diagnosis.cycle in (LOCK_CYCLE, LOCK_WAIT):
        rule, step = rules.LIVE_LOCK_DEADLOCK, rules.LIVE_LOCK_DEADLOCK.fix
        what = f"threads {threads} wait on each other's locks"
    else:
        rule, step = rules.LIVE_NO_PROGRESS, rules.LIVE_NO_PROGRESS.fix
        what = f"no progress for {diagnosis.stalled_s:.0f} s and no lock cycle in the stacks"
    latency = hang.latency_s
    message = f"{record.label}: {what}. Next: {step}"
    involved = [stack for stack in hang.stacks if stack.name in diagnosis.threads] or list(hang.stacks)
    evidence = {**_base(record), "cycle": diagnosis.cycle, "threads": list(diagnosis.threads),
                "chain": list(diagnosis.chain), "detected_at_s": hang.detected_at_s,
                "last_clear_sample_at_s": hang.last_clear_sample_at_s, "latency_s": latency,
                "last_event_at_s": hang.last_event_at_s,
                "stacks": {stack.name: _where(stack.frames) for stack in involved}, "next": step}
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
    where = f" at {raised.where()}" if raised is not None else ""
    evidence = {**_base(record), "worker": death.thread, "error_type": death.error_type, "error": death.error,
                "at_s": death.at_s, "traceback": _where(death.raised_at), "tracing": list(death.tracing),
                "tracing_stack": _where(death.tracing_stack), "last_tracer": death.last_tracer}
    said = f"{death.error_type}: {death.error.splitlines()[0] if death.error else ''}"
    if death.patcher_race:
        step = next_step(Hazard.PATCHER_RACE, record)
        entry = _trace_entry(death.tracing_stack)
        if death.tracing:
            inner = entry.where() if entry is not None else "a frame not captured"
            held = f"{', '.join(death.tracing)} was inside an FX trace started at {inner}"
        elif death.last_tracer == death.thread:
            held = (f"the last FX trace before it was {death.thread}'s own, ended at {death.last_trace_at_s:.1f} s: "
                    "a thread it waited on met that trace's patches and the error was re-raised here")
        elif death.last_tracer is not None:
            held = (f"no other thread traced at that moment; the last FX trace before it was {death.last_tracer}'s, "
                    f"ended at {death.last_trace_at_s:.1f} s")
        else:
            held = "no other thread was inside an FX trace when it died (the trace that patched it had ended)"
        how = "" if is_patcher_error(death.error) else \
            " (a Dynamo guard broke while torch.fx's patches swapped nn.Module.__call__ under the compile)"
        message = (f"{death.thread} ({record.label}) died of the FX patcher race at {death.at_s:.1f} s{where}: "
                   f"{said}{how}; {held}. Next: {step}")
        # SARIF points at the tracing thread's line when there is one: that is the line to change
        located = entry or raised
        return rules.RUN_PATCHER_RACE.finding(message, evidence={**evidence, "next": step}, **_location(located))
    message = f"{death.thread} ({record.label}) died at {death.at_s:.1f} s{where}: {said}"
    return rules.RUN_THREAD_DIED.finding(message[:600], evidence=evidence, **_location(raised))


def _death_findings(record: ProcessRecord) -> List[Finding]:
    """One finding per dead thread, except the FX-tracing error's victims: DFD901 already says who held the flag."""
    blamed = {blame.victim for blame in record.blames}
    return [_death_finding(record, death) for death in record.deaths if death.thread not in blamed]


def findings_from_records(records: Sequence[ProcessRecord]) -> List[Finding]:
    findings: List[Finding] = []
    for record in records:
        findings.extend(_fx_findings(record))
        findings.extend(_death_findings(record))
        hang = _hang_finding(record)
        if hang is not None:
            findings.append(hang)
    return findings


def example_findings(text: str) -> List[Finding]:
    """A live facts rule example's findings (rule_examples.py EXAMPLE_RUNNERS)."""
    import json

    return findings_from_records([ProcessRecord.from_dict(p) for p in json.loads(text)["processes"]])

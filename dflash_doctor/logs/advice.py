"""What to do next about a logs report: one line per kind of finding, the command to run or the fix.

The fix texts come from the rule registry and the mitigation registry (dflash_doctor/mitigations.py), so the
advice cannot drift from `explain` and `repro`.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

from dflash_doctor.findings import Finding
from dflash_doctor.hazards import Hazard
from dflash_doctor.rules import lookup
from dflash_doctor.rules.logs import LOG_RULES


def fix_line(hazards: Iterable[Hazard]) -> Optional[str]:
    """The mitigation registry's first complete recommendation for `hazards`, as one line."""
    from dflash_doctor.mitigations import recommend

    recommended = recommend(hazards)
    if not recommended:
        return None
    best = recommended[0]
    return f"fix ({best.label}): " + "; ".join(best.api)


def _workers(findings: Sequence[Finding]) -> List[str]:
    return sorted({str(f.evidence.get("thread")) for f in findings if f.evidence.get("thread")})


def next_steps(findings: Sequence[Finding], threads: Optional[Dict[str, dict]] = None,
               workers: Optional[int] = None) -> List[str]:
    """Steps for the findings, most severe kind first; `workers` is how many threads a repro should start."""
    threads = threads or {}
    by_code: Dict[str, List[Finding]] = {}
    for finding in sorted(findings, key=lambda f: (-f.severity.rank, f.line or 0)):
        by_code.setdefault(finding.code, []).append(finding)
    steps: List[str] = []
    for code, found in by_code.items():
        steps += _steps_for(code, found, threads, workers)
    unique: List[str] = []
    for step in steps:
        if step not in unique:
            unique.append(step)
    return unique


def _steps_for(code: str, found: List[Finding], threads: Dict[str, dict], workers: Optional[int]) -> List[str]:
    count = workers or max(2, len([t for t in threads if t != "main"]))
    if code == "DFD501":
        return ["dflash-doctor guards: does the installed torch check a process-global FX-tracing flag on every "
                "compiled call?",
                f"dflash-doctor repro --threads {count} --matrix: which mitigation removes the race on this machine",
                "dflash-doctor scan <trainer dir>: the compiled calls reached from threads (DFD201)"] + list(
            filter(None, [fix_line({Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG, Hazard.DEADLOCK})]))
    if code == "DFD515":
        if any(f.evidence.get("cycle") == "compile-lock-autograd" for f in found):
            return [f"dflash-doctor repro --threads {count} --shapes per-thread: reproduce the deadlock here"] + list(
                filter(None, [fix_line({Hazard.DEADLOCK, Hazard.FX_FLAG_LEAK, Hazard.STUCK_FLAG})]))
        return ["py-spy dump --pid PID a second time: threads that have not moved are stuck where the dump shows"]
    if code == "DFD507":
        return [f"py-spy dump --pid PID: where {', '.join(_workers(found))} wait (a compile-lock deadlock shows "
                "compile_fx_backward on one thread and autograd on another)"]
    if code in ("DFD504", "DFD512") and any(f.evidence.get("inner_cause") in (None, "collective timeout")
                                            for f in found):
        first = _stopped_first(threads)
        where = f" ({first})" if first else ""
        return [f"a collective timed out: find the rank that stopped first{where} and read its own error or "
                "stack; the timeouts of the others follow from it"]
    if code == "DFD514" and any(f.evidence.get("signal") == "SIGKILL" for f in found):
        return ["dmesg -T | grep -i -e 'killed process' -e 'out of memory': SIGKILL is usually the host's OOM "
                "killer (host RAM, not GPU memory)"]
    if code in ("DFD502", "DFD505", "DFD506"):
        return ["dflash-doctor scan <trainer dir>: flex_attention reached uncompiled (DFD202) or the FX error "
                "silenced (DFD301)", _fix(code)]
    if code == "DFD503":
        drop = found[0]
        return [f"read the log just before line {drop.evidence.get('from_line', drop.line)}: a worker that "
                "died, a recompile or a fallback explains most drops"]
    declared = LOG_RULES.get(code)
    if declared is not None and declared.next_steps:
        return list(declared.next_steps) + [_fix(code)]
    return [_fix(code)]


def _fix(code: str) -> str:
    rule = lookup(code)
    return f"{code}: {rule.fix}" if rule is not None and rule.fix else f"dflash-doctor explain {code}"


def _stopped_first(threads: Dict[str, dict]) -> Optional[str]:
    ranked = [(t["last_step"], name) for name, t in threads.items()
              if t.get("last_step") is not None and name != "main"]
    if len(ranked) < 2:
        return None
    step, name = min(ranked)
    return f"{name}, last step {step}"


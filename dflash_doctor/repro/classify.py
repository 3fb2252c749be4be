"""From phase results to the verdict: reproduced or not, which kind, and who is to blame. Pure data in, data out:
the typed record a child wrote (repro/phase_record.py) in, the typed facts (repro/facts.py) out."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

from dflash_doctor.outcomes import BlameKind, FailureKind, RecorderEventKind, ThreadOutcome
from dflash_doctor.repro.facts import (
    EventFacts,
    PhaseExtras,
    PhaseFacts,
    ProcessFacts,
    SelfCheckFacts,
    ShimStatusFacts,
    ThreadFacts,
    TracingThreadFacts,
)
from dflash_doctor.repro.phase_record import PhaseRecord, ProcessPart, SelfCheck, ThreadRecord
from dflash_doctor.runtime.fx_patches import is_guard_break, is_patcher_error
from dflash_doctor.runtime.recorder import FX_ERROR_PREFIX, Blame, Event


def is_fx_error_text(error: Optional[str]) -> bool:
    return error is not None and FX_ERROR_PREFIX in error


def classify_phase(result: PhaseRecord) -> Tuple[Optional[FailureKind], List[Blame]]:
    """(kind, blame) for a multi-thread phase result; kind None when every thread finished its steps."""
    blame = [b for b in result.blame if b.holder] or list(result.blame)
    if result.outcome == ThreadOutcome.OK:
        return None, []
    if result.outcome == ThreadOutcome.HUNG:
        hang = result.hang
        return (FailureKind.DEADLOCK if hang is not None and hang.kind == FailureKind.DEADLOCK
                else FailureKind.OTHER_ERROR), []
    errors = [t.error for t in result.threads if t.outcome == ThreadOutcome.ERROR]
    tracer = result.tracing_thread
    if tracer is not None and tracer.outcome == ThreadOutcome.ERROR:
        errors.append(tracer.error)
    if any(is_fx_error_text(e) for e in errors):
        if any(b.kind == BlameKind.STUCK_FLAG for b in blame):
            return FailureKind.STUCK_FLAG, blame
        return FailureKind.FX_FLAG_LEAK, blame
    if any(is_patcher_error(e) for e in errors):
        return FailureKind.PATCHER_RACE, blame
    if _traced_beside_the_workers(result) and any(is_guard_break(e) for e in errors):
        return FailureKind.PATCHER_RACE, blame  # a trace beside them swapped nn.Module under a compile
    return FailureKind.OTHER_ERROR, blame


def _traced_beside_the_workers(result: PhaseRecord) -> bool:
    """A thread other than the workers ran a torch.fx trace: the foreign-trace stress's tracer, or the forced and
    stuck stresses' holders, whose flag is held inside real traces (repro/disturb.py)."""
    if result.tracing_thread is not None:
        return True
    workers = {t.name for t in result.threads}
    return any(e.kind == RecorderEventKind.FX_TRACE and e.thread not in workers for e in result.events)


def _events(events: Sequence[Event]) -> List[EventFacts]:
    return [cast(EventFacts, event.to_dict()) for event in events]


def _check(check: Optional[SelfCheck]) -> Optional[SelfCheckFacts]:
    return None if check is None else {"ok": check.ok, "detail": check.detail}


def _extras(result: PhaseRecord) -> PhaseExtras:
    """The keys a child fills only sometimes, in PhaseExtras' order (the model is the one list of them), each
    only where it is filled (not empty, not null, not 0)."""
    setup, tracer = result.setup, result.tracing_thread
    values: Dict[str, Any] = {
        "run_s": result.run_s, "setup_s": result.setup_s, "warmup_s": list(result.warmup_s),
        "hang": None if result.hang is None else result.hang.to_dict(),
        "stacks": [stack.to_dict() for stack in result.stacks], "disturbance": result.disturbance,
        "crash": result.crash, "log_tail": result.log_tail,
        "shim": None if setup.shim is None else cast(ShimStatusFacts, setup.shim.to_dict()),
        "shim_check": _check(setup.shim_check),
        "fx_patches": None if setup.fx_patches is None else setup.fx_patches.to_dict(),
        "fx_patches_check": _check(setup.fx_patches_check),
        "tracing_thread": None if tracer is None else TracingThreadFacts(
            name=tracer.name, outcome=tracer.outcome.value, error=tracer.error, traces=tracer.traces)}
    return cast(PhaseExtras, {key: values[key] for key in PhaseExtras.__annotations__ if values[key]})


def phase_facts(result: PhaseRecord) -> PhaseFacts:
    """The contract's phase object ({outcome, seconds, threads}) plus what the views and the trace need."""
    threads: List[ThreadFacts] = [_thread_facts(t) for t in result.threads]
    facts: PhaseFacts = {"outcome": result.outcome.value, "seconds": result.seconds, "threads": threads,
                         **_extras(result), "steps_per_s": steps_per_second(result),
                         "events": _events(result.events)}
    if result.processes:
        facts["processes"] = [ProcessFacts(threads=list(part.threads), events=_events(part.events))
                              for part in result.processes]
    return facts


def _thread_facts(record: ThreadRecord) -> ThreadFacts:
    """A worker's record as the facts keep it (the child's also has its traceback and time)."""
    facts: ThreadFacts = {"name": record.name, "outcome": record.outcome.value, "error": record.error,
                          "steps": record.steps}
    if record.autograd_multithreading is not None:
        facts["autograd_multithreading"] = record.autograd_multithreading
    if record.switches is not None:
        facts["switches"] = dict(record.switches)
    if record.lazy_backward_compiles is not None:
        facts["lazy_backward_compiles"] = record.lazy_backward_compiles
    return facts


def steps_per_second(result: PhaseRecord) -> Optional[float]:
    done = sum(t.steps for t in result.threads)
    if not done or not result.run_s:
        return None
    return round(done / result.run_s, 3)


def merge_process_results(results: Sequence[PhaseRecord]) -> PhaseRecord:
    """The `processes` mitigation runs one child per worker; combine them into one multi-thread phase. What a
    process alone has (its stacks, its set-up, how it crashed) stays with it."""
    order = {ThreadOutcome.HUNG: 2, ThreadOutcome.ERROR: 1, ThreadOutcome.OK: 0}
    outcome = max((r.outcome for r in results), key=lambda o: order.get(o, 1), default=ThreadOutcome.ERROR)
    counted = [r.cpu_s for r in results if r.cpu_s is not None]
    return PhaseRecord(
        phase="multi", outcome=outcome, seconds=max((r.seconds for r in results), default=0.0),
        threads=tuple(t for r in results for t in r.threads), blame=tuple(b for r in results for b in r.blame),
        problems=tuple(p for r in results for p in r.problems),
        hang=next((r.hang for r in results if r.hang is not None), None),
        run_s=max((r.run_s or 0.0 for r in results), default=0.0),
        torch_version=next((r.torch_version for r in results if r.torch_version), None),
        cpu_s=round(sum(counted), 3) if counted else None,
        processes=tuple(ProcessPart(tuple(t.name for t in r.threads), r.events) for r in results))

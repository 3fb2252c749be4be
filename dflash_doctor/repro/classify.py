"""From phase results to the verdict: reproduced or not, which kind, and who is to blame. Pure data in, data out."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, cast

from dflash_doctor.outcomes import BlameKind, FailureKind, RecorderEventKind, ThreadOutcome
from dflash_doctor.repro.facts import PhaseExtras, PhaseFacts, ThreadFacts
from dflash_doctor.runtime.fx_patches import is_guard_break, is_patcher_error
from dflash_doctor.runtime.recorder import FX_ERROR_PREFIX


def is_fx_error_text(error: Optional[str]) -> bool:
    return error is not None and FX_ERROR_PREFIX in error


def classify_phase(result: dict) -> Tuple[Optional[FailureKind], List[dict]]:
    """(kind, blame) for a multi-thread phase result; kind None when every thread finished its steps."""
    outcome = result.get("outcome")
    blame = [b for b in result.get("blame") or [] if b.get("holder")] or list(result.get("blame") or [])
    if outcome == ThreadOutcome.OK:
        return None, []
    if outcome == ThreadOutcome.HUNG:
        hang = result.get("hang") or {}
        return (FailureKind.DEADLOCK if hang.get("kind") == FailureKind.DEADLOCK else FailureKind.OTHER_ERROR), []
    errors = [t.get("error") for t in result.get("threads", []) if t.get("outcome") == ThreadOutcome.ERROR]
    tracer = result.get("tracing_thread") or {}
    if tracer.get("outcome") == ThreadOutcome.ERROR:
        errors.append(tracer.get("error"))
    if any(is_fx_error_text(e) for e in errors):
        if any(b.get("kind") == BlameKind.STUCK_FLAG for b in blame):
            return FailureKind.STUCK_FLAG, blame
        return FailureKind.FX_FLAG_LEAK, blame
    if any(is_patcher_error(e) for e in errors):
        return FailureKind.PATCHER_RACE, blame
    if _traced_beside_the_workers(result) and any(is_guard_break(e) for e in errors):
        return FailureKind.PATCHER_RACE, blame  # a trace beside them swapped nn.Module under a compile
    return FailureKind.OTHER_ERROR, blame


def _traced_beside_the_workers(result: dict) -> bool:
    """A thread other than the workers ran a torch.fx trace: the foreign-trace stress's tracer, or the forced and
    stuck stresses' holders, whose flag is held inside real traces (repro/disturb.py)."""
    if result.get("tracing_thread"):
        return True
    workers = {t.get("name") for t in result.get("threads", [])}
    return any(e.get("kind") == RecorderEventKind.FX_TRACE and e.get("thread") not in workers
               for e in result.get("events") or [])


def phase_facts(result: dict) -> PhaseFacts:
    """The contract's phase object ({outcome, seconds, threads}) plus what the views and the trace need."""
    threads: List[ThreadFacts] = [_thread_facts(t) for t in result.get("threads", [])]
    # PhaseExtras declares the keys a child fills only sometimes, in their order: the model is the one list of them.
    extras = cast(PhaseExtras, {key: result[key] for key in PhaseExtras.__annotations__ if result.get(key)})
    return {"outcome": result.get("outcome", ThreadOutcome.ERROR), "seconds": result.get("seconds", 0.0),
            "threads": threads, **extras, "steps_per_s": steps_per_second(result), "events": result.get("events", [])}


def _thread_facts(record: dict) -> ThreadFacts:
    """A worker's record as the facts keep it (the child's also has its traceback and time)."""
    facts: ThreadFacts = {"name": record["name"], "outcome": record["outcome"], "error": record.get("error"),
                          "steps": record.get("steps", 0)}
    if "autograd_multithreading" in record:
        facts["autograd_multithreading"] = record["autograd_multithreading"]
    if "switches" in record:
        facts["switches"] = record["switches"]
    if "lazy_backward_compiles" in record:
        facts["lazy_backward_compiles"] = record["lazy_backward_compiles"]
    return facts


def steps_per_second(result: dict) -> Optional[float]:
    done = sum(t.get("steps", 0) for t in result.get("threads", []))
    run_s = result.get("run_s")
    if not done or not run_s:
        return None
    return round(done / run_s, 3)


def merge_process_results(results: Sequence[dict]) -> dict:
    """The `processes` mitigation runs one child per worker; combine them into one multi-thread phase."""
    order = {ThreadOutcome.HUNG: 2, ThreadOutcome.ERROR: 1, ThreadOutcome.OK: 0}
    outcome = max((r.get("outcome", ThreadOutcome.ERROR) for r in results), key=lambda o: order.get(o, 1),
                  default=ThreadOutcome.ERROR)
    merged = {"phase": "multi", "outcome": outcome, "threads": [t for r in results for t in r.get("threads", [])],
              "blame": [b for r in results for b in r.get("blame") or []],
              "seconds": max((r.get("seconds", 0.0) for r in results), default=0.0),
              "run_s": max((r.get("run_s") or 0.0 for r in results), default=0.0),
              "events": [], "problems": [p for r in results for p in r.get("problems") or []],
              "processes": [{"threads": [t["name"] for t in r.get("threads", [])], "events": r.get("events", [])}
                            for r in results]}
    counted = [r["cpu_s"] for r in results if r.get("cpu_s") is not None]
    merged["cpu_s"] = round(sum(counted), 3) if counted else None
    for result in results:
        if result.get("hang") and not merged.get("hang"):
            merged["hang"] = result["hang"]
        if result.get("torch_version"):
            merged.setdefault("torch_version", result["torch_version"])
    return merged

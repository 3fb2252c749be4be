"""Pipeline facts -> findings (DFD8xx). Pure: the rules' JSON examples go through exactly this function.

Only root causes get a finding: a worker that stopped because another died is evidence, not a finding. A run
with a dead or hung worker always gets at least one finding.

The facts are read through their model (reference/facts.py), but with .get(): the rules' examples are documents
trimmed to what the rules read, so a key the model requires may be absent from them.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, cast

from dflash_doctor.findings import Finding, Problem
from dflash_doctor.outcomes import BlameKind, HangCycle
from dflash_doctor.reference.facts import PipelineFacts, PipelineWorkerFacts, ThreadStackFacts
from dflash_doctor.reference.results import Outcome
from dflash_doctor.runtime.fx_patches import is_patcher_error
from dflash_doctor.runtime.recorder import FX_ERROR_PREFIX
from dflash_doctor.rules import pipeline as rules

TRACEBACK_LINES = 12


def _where(facts: PipelineFacts) -> Dict[str, Any]:
    return {"preset": facts.get("preset"), "workers_mode": facts.get("workers_mode"),
            "device_type": facts.get("device_type"), "mitigation": facts.get("mitigation")}


def _worker_evidence(worker: PipelineWorkerFacts) -> Dict[str, Any]:
    evidence: Dict[str, Any] = {
        "name": worker.get("name"), "role": worker.get("role"), "device": worker.get("device"),
        "outcome": worker.get("outcome"), "steps": worker.get("steps"), "phase": worker.get("phase"),
        "error": worker.get("error"),
    }
    trace = worker.get("traceback")
    if trace:
        evidence["traceback"] = trace.rstrip().splitlines()[-TRACEBACK_LINES:]
    return evidence


def _stopped(facts: PipelineFacts, except_name: str) -> List[str]:
    return [w["name"] for w in facts.get("workers", []) if w.get("outcome") == Outcome.STOPPED and w["name"] != except_name]


def _fx_finding(facts: PipelineFacts, worker: PipelineWorkerFacts) -> Finding:
    blame = [b for b in facts.get("blame") or [] if b.get("victim") == worker["name"]] or list(facts.get("blame") or [])
    holders = sorted({holder for holder in (b.get("holder") for b in blame) if holder})
    stuck = any(b.get("kind") == BlameKind.STUCK_FLAG for b in blame)
    held = (f"; the FX flag was {'left stuck' if stuck else 'held'} by {', '.join(holders)}" if holders
            else "; no other thread was inside an FX trace at that moment (the flag was already stuck?)")
    message = (f"{worker['name']} raised the FX-tracing RuntimeError in its step {worker.get('steps', 0) + 1} "
               f"({worker.get('phase')}){held}")
    evidence = {**_where(facts), "worker": _worker_evidence(worker), "blame": blame,
                "stopped": _stopped(facts, worker["name"])}
    return rules.FX_FLAG_ERROR.finding(message, evidence=evidence)


def _involved_stacks(facts: PipelineFacts, threads: List[str]) -> List[ThreadStackFacts]:
    return [s for s in facts.get("stacks") or [] if s.get("name") in threads]


def _hang_finding(facts: PipelineFacts, hung: List[PipelineWorkerFacts]) -> Finding:
    hang = facts.get("hang")  # None when a worker was seen hung but the stall itself was not classified
    cycle = hang.get("cycle") if hang else None
    chain = list(hang.get("chain") or []) if hang else []
    threads = list(hang.get("threads") or []) if hang else []
    names = ", ".join(w["name"] for w in hung) or facts.get("failed_worker") or "the workers"
    if cycle == HangCycle.COMPILE_LOCK_AUTOGRAD:
        rule, what = rules.COMPILE_DEADLOCK, "deadlocked on compile_lock and the autograd device thread"
    elif cycle in (HangCycle.LOCK_CYCLE, HangCycle.LOCK_WAIT):
        rule, what = rules.LOCK_DEADLOCK, "deadlocked on locks"
    else:
        rule, what = rules.WORKERS_HUNG, "made no progress (no lock cycle in the stacks)"
    cycle_threads = ", ".join(threads) if threads and rule is not rules.WORKERS_HUNG else ""
    message = f"{names} {what}" + (f" (threads in the cycle: {cycle_threads})" if cycle_threads else "")
    evidence = {**_where(facts), "hung": [_worker_evidence(w) for w in hung], "cycle": cycle, "chain": chain,
                "threads": threads, "stalled_s": hang.get("stalled_s") if hang else None,
                "stacks": _involved_stacks(facts, threads), "stopped": _stopped(facts, "")}
    return rule.finding(message, evidence=evidence)


def _death_finding(facts: PipelineFacts, worker: PipelineWorkerFacts) -> Finding:
    evidence = {**_where(facts), "worker": _worker_evidence(worker), "stopped": _stopped(facts, worker["name"])}
    if worker.get("outcome") == Outcome.KILLED:
        message = f"{worker['name']} ({worker.get('role')} on {worker.get('device')}) was killed: {worker.get('error')}"
        return rules.WORKER_KILLED.finding(message, evidence=evidence)
    error = worker.get("error") or "no error message"
    if worker.get("role") == "set-up":  # before any worker started: the set-up thread itself
        return rules.WORKER_ERROR.finding(f"set-up failed before the workers started: {error}", evidence=evidence)
    message = f"{worker['name']} ({worker.get('role')} on {worker.get('device')}) died in {worker.get('phase')}: {error}"
    return rules.WORKER_ERROR.finding(message, evidence=evidence)


def is_fx_error(error: Optional[str]) -> bool:
    return error is not None and FX_ERROR_PREFIX in error


def _patcher_finding(facts: PipelineFacts, worker: PipelineWorkerFacts) -> Finding:
    tracers = [w["name"] for w in facts.get("workers") or [] if w.get("role") == "tracer"]
    by = f" while {', '.join(tracers)} traced" if tracers else ""
    message = (f"{worker['name']} ({worker.get('role')} on {worker.get('device')}) met another thread's torch.fx "
               f"patches in {worker.get('phase')}{by}: {worker.get('error')}")
    evidence = {**_where(facts), "worker": _worker_evidence(worker), "tracers": tracers,
                "stopped": _stopped(facts, worker["name"])}
    return rules.FX_PATCHER_RACE.finding(message, evidence=evidence)


def _unlisted_worker(name: str) -> PipelineWorkerFacts:
    """The failed worker a document names but does not list (only a trimmed one does: a rule example, a test).
    Its name and that it failed are all that is known; the findings read every other key with .get(), which is
    why this partial entry can stand in for a listed worker."""
    return cast(PipelineWorkerFacts, {"name": name, "outcome": Outcome.ERROR})


def findings_from_facts(facts: PipelineFacts) -> List[Finding]:
    """The findings of one pipeline run (empty for a healthy or interrupted-but-healthy run)."""
    workers = facts.get("workers") or []
    findings: List[Finding] = []
    hung = [w for w in workers if w.get("outcome") == Outcome.HUNG]
    for worker in workers:
        if worker.get("outcome") == Outcome.ERROR and is_fx_error(worker.get("error")):
            findings.append(_fx_finding(facts, worker))
        elif worker.get("outcome") == Outcome.ERROR and is_patcher_error(worker.get("error")):
            findings.append(_patcher_finding(facts, worker))
        elif worker.get("outcome") in (Outcome.ERROR, Outcome.KILLED):
            findings.append(_death_finding(facts, worker))
    if hung or facts.get("hang"):
        findings.append(_hang_finding(facts, hung))
    failed = facts.get("failed_worker")
    if failed and not findings:  # never "no findings" for a run that lost a worker
        listed = next((w for w in workers if w["name"] == failed), None)
        findings.append(_death_finding(facts, listed if listed is not None else _unlisted_worker(failed)))
    return findings


def problems_from_facts(facts: PipelineFacts, save_dir: Optional[str]) -> List[Problem]:
    """What the run could not do that was asked of it: a --save whose write failed (a full disk, `ulimit -f`).
    A problem (exit bit 4), not a finding: the training itself ended well."""
    return [Problem(f"--save {save_dir}", f"the trained drafter could not be saved: {worker['save_error']}",
                    "free space (or raise the file-size limit) and run again; no checkpoint was written")
            for worker in facts.get("workers") or [] if worker.get("save_error")]


def example_findings(text: str) -> List[Finding]:
    """A pipeline facts rule example's findings (rule_examples.py EXAMPLE_RUNNERS)."""
    import json

    return findings_from_facts(json.loads(text))

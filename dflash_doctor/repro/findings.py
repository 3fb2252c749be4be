"""Repro facts -> findings (DFD7xx). Pure: the rules' JSON examples go through exactly this function."""
from __future__ import annotations

from typing import List

from dflash_doctor.findings import Finding
from dflash_doctor.outcomes import FailureKind, ThreadOutcome
from dflash_doctor.rules import repro as rules

DYNAMO_CYCLE = "compile-lock-autograd"


def _failed_threads(facts: dict) -> List[dict]:
    multi = facts.get("multi_thread") or {}
    return [t for t in multi.get("threads", []) if t.get("outcome") in (ThreadOutcome.ERROR, ThreadOutcome.HUNG)]


def _where(facts: dict) -> dict:
    return {"mode": facts.get("mode"), "mitigation": facts.get("mitigation"), "threads": facts.get("threads"),
            "device": facts.get("device"), "torch_version": facts.get("torch_version")}


def findings_from_facts(facts: dict) -> List[Finding]:
    """One finding for a reproduced race, none when the verdict is not-reproduced."""
    if facts.get("verdict") != "reproduced":
        return []
    kind = facts.get("kind")
    failed = _failed_threads(facts)
    victims = [t["name"] for t in failed]
    error = next((t.get("error") for t in failed if t.get("error")), None)
    blame = facts.get("blame") or []
    holders = sorted({b["holder"] for b in blame if b.get("holder")})
    evidence = {**_where(facts), "victims": victims, "error": error, "blame": blame}
    if kind in (FailureKind.FX_FLAG_LEAK, FailureKind.STUCK_FLAG):
        rule = rules.FX_FLAG_LEAK if kind == FailureKind.FX_FLAG_LEAK else rules.FX_FLAG_STUCK
        verb = "held" if kind == FailureKind.FX_FLAG_LEAK else "left stuck"
        held = f"; the FX flag was {verb} by {', '.join(holders)}" if holders else ""
        message = f"{', '.join(victims) or 'a worker'} raised the FX-tracing RuntimeError{held}"
        return [rule.finding(message, evidence=evidence)]
    if kind == FailureKind.DEADLOCK:
        hang = (facts.get("multi_thread") or {}).get("hang") or facts.get("hang") or {}
        chain = list(hang.get("chain") or [])
        rule = rules.COMPILE_LOCK_DEADLOCK if hang.get("cycle") == DYNAMO_CYCLE else rules.THREAD_DEADLOCK
        message = f"{len(victims)} thread(s) hung: {'; '.join(chain[:2]) or 'no progress'}"
        return [rule.finding(message, evidence={**evidence, "chain": chain, "cycle": hang.get("cycle")})]
    if kind == FailureKind.PATCHER_RACE:
        tracer = (facts.get("multi_thread") or {}).get("tracing_thread") or {}
        if not error and tracer.get("error"):
            victims, error = [tracer.get("name", "the tracing thread")], tracer["error"]
        message = (f"{', '.join(victims) or 'a worker'} met another thread's torch.fx patches: "
                   f"{error or 'the FX patcher race'}")
        return [rules.FX_PATCHER_RACE.finding(message, evidence={**evidence, "victims": victims, "error": error})]
    message = f"{', '.join(victims) or 'a worker'} failed only when threaded: {error or 'hung without a lock cycle'}"
    return [rules.THREADED_STEP_FAILED.finding(message, evidence=evidence)]


def example_findings(text: str) -> List[Finding]:
    """A repro facts rule example's findings (rule_examples.py EXAMPLE_RUNNERS)."""
    import json

    return findings_from_facts(json.loads(text))

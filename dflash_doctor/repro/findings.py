"""Repro facts -> findings (DFD7xx). Pure: the rules' JSON examples go through exactly this function."""
from __future__ import annotations

from typing import Any, Dict, List

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.outcomes import FailureKind, HangCycle, ThreadOutcome
from dflash_doctor.repro.facts import ReproFacts, ThreadFacts
from dflash_doctor.rules import repro as rules

def _failed_threads(facts: ReproFacts) -> List[ThreadFacts]:
    multi = facts["multi_thread"]
    threads = multi["threads"] if multi else []
    return [t for t in threads if t["outcome"] in (ThreadOutcome.ERROR, ThreadOutcome.HUNG)]


def _where(facts: ReproFacts) -> Dict[str, Any]:
    return {"mode": facts["mode"], "mitigation": facts["mitigation"], "threads": facts["threads"],
            "device": facts["device"], "torch_version": facts["torch_version"]}


# The rule each race the baseline reproduced is reported under, besides the headline's own.
_RULE_OF_KIND = {FailureKind.FX_FLAG_LEAK: rules.FX_FLAG_LEAK, FailureKind.STUCK_FLAG: rules.FX_FLAG_STUCK,
                 FailureKind.DEADLOCK: rules.COMPILE_LOCK_DEADLOCK, FailureKind.PATCHER_RACE: rules.FX_PATCHER_RACE,
                 FailureKind.OTHER_ERROR: rules.THREADED_STEP_FAILED}


def findings_from_facts(facts: ReproFacts) -> List[Finding]:
    """One finding for a reproduced race (none when the verdict is not-reproduced), and, where the headline is the
    baseline, one for each other race it reproduced: a step with two races gets two findings, as the advice
    covers both."""
    return _headline_finding(facts) + _other_races(facts)


def _other_races(facts: ReproFacts) -> List[Finding]:
    """Only where the headline is the baseline itself (no --mitigation, or --matrix): a --mitigation run's finding
    is the fix's own failure, and its advice covers the baseline's races (next_steps.py)."""
    if facts["mitigation"] != "none":
        return []
    headline = facts["kind"] if facts["verdict"] == "reproduced" else None
    findings = []
    for entry in facts.get("baseline_reproduced") or []:
        kind = FailureKind(entry["kind"])
        if kind == headline:
            continue
        shown = (f"only under the injected {entry['stress']} stress: the step fails IF a thread traces with FX "
                 "while it runs" if entry["injected"] else f"under {entry['stress']} stress")
        message = f"the baseline (no mitigation) reproduced {kind} {shown}"
        # a race only an injected trace showed is a condition of the trainer, not a failure of the step: a warning
        severity = Severity.WARNING if entry["injected"] else None
        findings.append(_RULE_OF_KIND[kind].finding(message, severity=severity, evidence={
            **_where(facts), "kind": kind.value, "stress": entry["stress"], "injected": entry["injected"]}))
    return findings


def _headline_finding(facts: ReproFacts) -> List[Finding]:
    if facts["verdict"] != "reproduced":
        return []
    kind = facts["kind"]
    multi = facts["multi_thread"]
    failed = _failed_threads(facts)
    victims = [t["name"] for t in failed]
    error = next((t["error"] for t in failed if t["error"]), None)
    blame = facts["blame"]
    holders = sorted({holder for b in blame if (holder := b["holder"])})
    evidence = {**_where(facts), "victims": victims, "error": error, "blame": blame}
    if kind in (FailureKind.FX_FLAG_LEAK, FailureKind.STUCK_FLAG):
        rule = rules.FX_FLAG_LEAK if kind == FailureKind.FX_FLAG_LEAK else rules.FX_FLAG_STUCK
        verb = "held" if kind == FailureKind.FX_FLAG_LEAK else "left stuck"
        held = f"; the FX flag was {verb} by {', '.join(holders)}" if holders else ""
        message = f"{', '.join(victims) or 'a worker'} raised the FX-tracing RuntimeError{held}"
        return [rule.finding(message, evidence=evidence)]
    if kind == FailureKind.DEADLOCK:
        hang = (multi.get("hang") if multi else None) or facts.get("hang")
        chain = list(hang["chain"]) if hang else []
        cycle = hang["cycle"] if hang else None
        rule = rules.COMPILE_LOCK_DEADLOCK if cycle == HangCycle.COMPILE_LOCK_AUTOGRAD else rules.THREAD_DEADLOCK
        message = f"{len(victims)} thread(s) hung: {'; '.join(chain[:2]) or 'no progress'}"
        return [rule.finding(message, evidence={**evidence, "chain": chain, "cycle": cycle})]
    if kind == FailureKind.PATCHER_RACE:
        tracer = multi.get("tracing_thread") if multi else None
        if not error and tracer and tracer["error"]:
            victims, error = [tracer["name"]], tracer["error"]
        message = (f"{', '.join(victims) or 'a worker'} met another thread's torch.fx patches: "
                   f"{error or 'the FX patcher race'}")
        return [rules.FX_PATCHER_RACE.finding(message, evidence={**evidence, "victims": victims, "error": error})]
    if kind == FailureKind.DATAPARALLEL_COMPILED_MODULE:
        message = (f"nn.DataParallel replicated a compiled module and the user's model lost its submodules; "
                   f"{', '.join(victims) or 'a replica'} raised: {error or 'an error'}")
        return [rules.DATAPARALLEL_COMPILED_MODULE.finding(message, evidence=evidence)]
    message = f"{', '.join(victims) or 'a worker'} failed only when threaded: {error or 'hung without a lock cycle'}"
    return [rules.THREADED_STEP_FAILED.finding(message, evidence=evidence)]


def example_findings(text: str) -> List[Finding]:
    """A repro facts rule example's findings (rule_examples.py EXAMPLE_RUNNERS): an example document has the keys
    findings_from_facts reads, not a whole report's."""
    import json

    return findings_from_facts(json.loads(text))

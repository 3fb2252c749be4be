"""DFD8xx findings name what a user needs, and a failed run never yields none. (Every rule's bad and good examples
run in tests/test_rule_examples.py.)"""
from __future__ import annotations

import json

from dflash_doctor.reference.findings import findings_from_facts
from dflash_doctor.rules import all_rules

PIPELINE_RULES = [rule for rule in all_rules() if rule.code.startswith("DFD8")]


def _rule(code):
    return next(r for r in PIPELINE_RULES if r.code == code)


def test_the_fx_finding_names_the_victim_its_step_and_the_thread_that_held_the_flag():
    [finding] = findings_from_facts(json.loads(_rule("DFD803").bad))
    assert finding.message == ("drafter-1 raised the FX-tracing RuntimeError in its step 1 (first step (compiling)); "
                               "the FX flag was held by drafter-2")
    assert finding.evidence["stopped"] == ["target-0", "drafter-0"]
    assert finding.evidence["mitigation"] == "non-lazy-backward"


def test_the_compile_deadlock_finding_carries_the_cycle_and_the_hung_workers():
    [finding] = findings_from_facts(json.loads(_rule("DFD804").bad))
    assert finding.message == ("drafter-0, drafter-1 deadlocked on compile_lock and the autograd device thread "
                               "(threads in the cycle: drafter-1, thread-140233)")
    assert finding.evidence["chain"][0] == "drafter-1 holds compile_lock and waits in torch.autograd.grad"
    assert finding.evidence["cycle"] == "compile-lock-autograd"
    assert [w["name"] for w in finding.evidence["hung"]] == ["drafter-0", "drafter-1"]


def test_the_fix_text_comes_from_the_mitigation_registry():
    from dflash_doctor import mitigations

    best = mitigations.recommend(mitigations.covers(("threadlocal-flag", "non-lazy-backward")))[0]
    assert f"--mitigation {best.label}" in _rule("DFD804").fix
    assert all(api in _rule("DFD803").fix for api in best.api)


def test_a_failed_run_without_a_classifiable_worker_still_gets_a_finding():
    facts = {"failed_worker": "drafter-3", "workers": [{"name": "target-0", "outcome": "stopped"}]}
    [finding] = findings_from_facts(facts)
    assert finding.code == "DFD801" and finding.message.startswith("drafter-3")


def test_a_failed_set_up_is_a_finding_of_its_own():
    facts = {"failed_worker": "set-up", "workers": [
        {"name": "target-0", "outcome": "stopped"},
        {"name": "set-up", "role": "set-up", "outcome": "error", "error": "OutOfMemoryError: CUDA out of memory"}]}
    [finding] = findings_from_facts(facts)
    assert (finding.code, finding.message) == ("DFD801", "set-up failed before the workers started: "
                                                         "OutOfMemoryError: CUDA out of memory")


def test_an_interrupted_healthy_run_has_no_findings():
    facts = {"interrupted": "SIGINT", "failed_worker": None,
             "workers": [{"name": "target-0", "outcome": "stopped"}, {"name": "drafter-0", "outcome": "stopped"}]}
    assert findings_from_facts(facts) == []

"""DFD7xx findings carry what a user needs: the victims, who held the flag, the cycle. (Every rule's bad and good
examples run in tests/test_rule_examples.py.)"""
from __future__ import annotations

import json


from dflash_doctor.repro.findings import findings_from_facts
from dflash_doctor.rules import all_rules

REPRO_RULES = [rule for rule in all_rules() if rule.code.startswith("DFD7")]


def test_the_leak_finding_names_victims_and_holder():
    [finding] = findings_from_facts(json.loads(next(r for r in REPRO_RULES if r.code == "DFD701").bad))
    assert finding.message == ("drafter-0 raised the FX-tracing RuntimeError; the FX flag was held by fx-holder")
    assert finding.evidence["blame"] == [{"victim": "drafter-0", "holder": "fx-holder", "at_s": 10.9}]


def test_the_deadlock_finding_carries_the_chain():
    [finding] = findings_from_facts(json.loads(next(r for r in REPRO_RULES if r.code == "DFD703").bad))
    assert finding.evidence["cycle"] == "compile-lock-autograd"
    assert finding.evidence["chain"][1] == "thread-77 waits for compile_lock in compile_fx_backward"

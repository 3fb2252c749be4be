"""DFD7xx: each rule's bad example (a repro facts document) yields exactly that rule's finding through the same
classifier the harness uses; each good example yields none."""
from __future__ import annotations

import json

import pytest

from dflash_doctor.repro.findings import findings_from_facts
from dflash_doctor.rules import all_rules

REPRO_RULES = [rule for rule in all_rules() if rule.code.startswith("DFD7")]


def test_every_repro_rule_uses_repro_facts_examples():
    assert [r.code for r in REPRO_RULES] == ["DFD701", "DFD702", "DFD703", "DFD704", "DFD705"]
    assert {r.example_format for r in REPRO_RULES} == {"repro-facts"}


@pytest.mark.parametrize("rule", REPRO_RULES, ids=lambda r: r.code)
def test_bad_example_fires_exactly_its_rule(rule):
    findings = findings_from_facts(json.loads(rule.bad))
    assert [(f.code, f.name, f.severity) for f in findings] == [(rule.code, rule.name, rule.severity)]


@pytest.mark.parametrize("rule", REPRO_RULES, ids=lambda r: r.code)
def test_good_example_is_clean(rule):
    assert findings_from_facts(json.loads(rule.good)) == []


def test_the_leak_finding_names_victims_and_holder():
    [finding] = findings_from_facts(json.loads(next(r for r in REPRO_RULES if r.code == "DFD701").bad))
    assert finding.message == ("drafter-0 raised the FX-tracing RuntimeError; the FX flag was held by fx-holder")
    assert finding.evidence["blame"] == [{"victim": "drafter-0", "holder": "fx-holder", "at_s": 10.9}]


def test_the_deadlock_finding_carries_the_chain():
    [finding] = findings_from_facts(json.loads(next(r for r in REPRO_RULES if r.code == "DFD703").bad))
    assert finding.evidence["cycle"] == "compile-lock-autograd"
    assert finding.evidence["chain"][1] == "thread-77 waits for compile_lock in compile_fx_backward"

"""Every rule's examples are its tests (as Fixit does): the bad example fires the rule and the good one does not,
each run through the code the command itself runs (dflash_doctor/rule_examples.py EXAMPLE_RUNNERS). A rule is
covered the moment it is registered; the domain tests add what is particular to a domain (lines, columns,
evidence)."""
from __future__ import annotations

import pytest

from dflash_doctor.rules import all_rules
from dflash_doctor.rule_examples import EXAMPLE_RUNNERS, example_findings

RULES = all_rules()


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.code)
def test_the_bad_example_fires_its_rule(rule):
    assert rule.code in {finding.code for finding in example_findings(rule, rule.bad)}


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.code)
def test_the_good_example_is_clean(rule):
    assert example_findings(rule, rule.good) == []


def test_every_example_format_has_a_runner_and_is_used():
    assert {rule.example_format for rule in RULES} == set(EXAMPLE_RUNNERS)

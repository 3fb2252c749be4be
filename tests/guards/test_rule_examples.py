"""A layout rule's finding points at the line its bad example marks `# DFD6xx`. (Every rule's bad and good examples
run in tests/test_rule_examples.py.)"""
from __future__ import annotations

import pytest

from dflash_doctor.guards import findings_for_example
from dflash_doctor.guards.torch_sources import parse_bundle
from dflash_doctor.rules import all_rules
from dflash_doctor.rules import guards as guards_table
from dflash_doctor.rules.registry import Rule

GUARDS_RULES = [rule for rule in all_rules() if rule.code.startswith("DFD6")]


def test_the_guards_rules_are_registered():
    # Read from the table itself, not a typed count: a new DFD6xx rule needs no edit here, while a rule declared
    # in another table with a DFD6 code, or a code dropped or skipped in the range, fails.
    declared = {value.code for value in vars(guards_table).values() if isinstance(value, Rule)}
    codes = [rule.code for rule in GUARDS_RULES]
    assert declared == set(codes)
    assert codes == [f"DFD6{n:02d}" for n in range(1, len(codes) + 1)]
    assert {rule.example_format for rule in GUARDS_RULES} == {"torch-layout", "guards-state"}


@pytest.mark.parametrize("rule", [r for r in GUARDS_RULES if r.example_format == "torch-layout"],
                         ids=lambda rule: rule.code)
def test_layout_findings_point_at_the_marked_line(rule):
    [finding] = [f for f in findings_for_example(rule.example_format, rule.bad) if f.code == rule.code]
    marked = [(f"torch/{path}", number) for path, text in parse_bundle(rule.bad).items()
              for number, line in enumerate(text.splitlines(), start=1) if line.endswith(f"# {rule.code}")]
    assert marked == [(finding.path, finding.line)]

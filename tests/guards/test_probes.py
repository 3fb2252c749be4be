"""The probe registry (guards/probes.py) is the one place a probe is declared: each entry is complete, and its
rule, its finding and its hazard's verdict follow from it (the probe host's choices: tests/guards/test_runner.py)."""
from __future__ import annotations

import json

import pytest

from dflash_doctor.guards.hazard_findings import state_findings
from dflash_doctor.guards.probes import BY_NAME, PROBE_NAMES, PROBES
from dflash_doctor.guards.layout import read_layout
from dflash_doctor.guards.verdict import PRESENT, decide_hazards
from dflash_doctor.rules import lookup
from tests.conftest import REPO

UNKNOWN_LAYOUT = REPO / "fixtures" / "guards" / "torch-unknown"


def test_names_hazards_and_rules_are_one_per_probe():
    assert len(set(PROBE_NAMES)) == len({p.hazard for p in PROBES}) == len({p.rule.code for p in PROBES}) == len(PROBES)
    assert list(BY_NAME) == list(PROBE_NAMES)


@pytest.mark.parametrize("probe", PROBES, ids=lambda probe: probe.name)
def test_each_probe_carries_a_registered_guards_state_rule_whose_example_is_this_probe(probe):
    rule = probe.rule
    assert lookup(rule.code) is rule and rule.code.startswith("DFD6") and rule.example_format == "guards-state"
    assert json.loads(rule.bad) == {"probes": {probe.name: "reproduced"}}


@pytest.mark.parametrize("probe", PROBES, ids=lambda probe: probe.name)
def test_a_reproduction_reports_the_probe_rule_and_makes_its_hazard_present(probe):
    facts = {"probes": {probe.name: "reproduced"}, "probe_details": {probe.name: {"detail": "seen"}}}
    assert [(f.code, f.evidence) for f in state_findings(facts)] == [
        (probe.rule.code, {"probe": probe.name, "detail": "seen"})]
    assert state_findings({"probes": {probe.name: "not-reproduced"}}) == []
    verdicts = {v.hazard: v for v in decide_hazards(read_layout(UNKNOWN_LAYOUT), {probe.name: "reproduced"}, None)}
    assert verdicts[probe.hazard].state == PRESENT and verdicts[probe.hazard].probe == "reproduced"
    assert [h for h, v in verdicts.items() if v.state == PRESENT] == [probe.hazard]


"""The committed per-release evidence (benchmarks/guards_releases.py over the real wheels) and the release table in
dflash_doctor/guards/releases.py must tell the same story: editing one without re-running the other fails here."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_doctor.guards.releases import TABLE, row_for
from dflash_doctor.guards.verdict import evidence_of_row, source_states

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "guards_releases.json"
EVIDENCE = json.loads(RESULTS.read_text(encoding="utf-8"))


def test_every_table_row_was_read_from_a_wheel_and_nothing_failed():
    assert [r["version"] for r in EVIDENCE["releases"]] == [row.read_from for row in TABLE]
    assert EVIDENCE["failures"] == [] and EVIDENCE["cited_lines_checked"] > 0
    assert all(r["table_agrees"] and r["wheel"].startswith(f"torch-{r['version']}-") for r in EVIDENCE["releases"])


@pytest.mark.parametrize("release", EVIDENCE["releases"], ids=lambda r: r["version"])
def test_the_table_decides_each_hazard_as_the_wheel_did(release):
    states = source_states(evidence_of_row(row_for(release["version"])))
    assert {hazard.value: state for hazard, state in states.items()} == release["hazards"]
    assert release["verdict"] == "vulnerable"  # no release from 2.4 to 2.15 is free of every hazard

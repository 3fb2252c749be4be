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


@pytest.mark.parametrize("version, first", [("2.6.0", "threadlocal-flag,single-thread-autograd [inferred]"),
                                             ("2.8.0", "threadlocal-flag,single-thread-autograd [inferred]"),
                                             ("2.11.0", "threadlocal-flag,non-lazy-backward [measured (2.11, H200)]"),
                                             ("2.15.0", "non-lazy-backward [inferred]")])
def test_single_thread_autograd_is_ranked_on_every_release_with_the_deadlock_marked_measured_or_inferred(version,
                                                                                                        first):
    release = next(r for r in EVIDENCE["releases"] if r["version"] == version)
    assert release["fixes"][0] == first
    sta = [fix for fix in release["fixes"] if "single-thread-autograd" in fix]
    assert sta and all(fix.endswith("[inferred]") or fix.endswith("[measured (2.11, H200)]") for fix in sta)
    if version == "2.15.0":  # the flag is thread-local: the switch alone stops every severe hazard there
        assert "single-thread-autograd [inferred]" in release["fixes"]

"""DFD401-403 on the seeds' snapshot and on other topologies: the exact (code, gpu, role) sets."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_doctor.gpus.analyze import Thresholds, analyze_gpus, busy_level
from dflash_doctor.gpus.csv_snapshot import parse_columns
from dflash_doctor.gpus.readings import GpuReading
from dflash_doctor.gpus.roles import parse_roles
from dflash_doctor.gpus.sources import report_from_csv
from dflash_doctor.rules import all_rules
from dflash_doctor.rules import gpus as gpus_table
from dflash_doctor.rules.registry import Rule
from tests.conftest import REPO

FIXTURES = REPO / "fixtures" / "gpus"
SEED_ROLES = "target=0-4,drafter=5-7"


def found(report):
    return sorted((f.code, f.evidence["gpu"], f.evidence["role"]) for f in report.findings)


def snapshot(name, roles=None, columns=None, **kwargs):
    with open(FIXTURES / name, encoding="utf-8") as handle:
        return report_from_csv(handle, str(FIXTURES / name), roles=parse_roles(roles),
                               columns=parse_columns(columns) if columns else None, **kwargs)


SEED_FINDINGS = [
    ("DFD401", 5, "drafter"),
    ("DFD402", 0, "target"), ("DFD402", 3, "target"), ("DFD402", 4, "target"),
]


def test_seed_snapshot_gives_what_the_seed_engineer_read_by_eye():
    report = snapshot("seed003_snapshot.csv", SEED_ROLES)
    assert found(report) == SEED_FINDINGS
    assert report.problems == []
    assert report.facts["role_busy_level"] == {"drafter": 92.5, "target": 100.0}
    assert report.facts["skipped_checks"] == [
        "DFD403 on GPU 0, 1, 2, 3, 4, 5, 6, 7: memory.total unknown (add memory.total to the query or pass "
        "--memory-total)"]
    idle = next(f for f in report.findings if f.code == "DFD401")
    assert (idle.path, idle.line, idle.evidence["memory_used_mib"], idle.evidence["utilization"]) == (
        str(FIXTURES / "seed003_snapshot.csv"), 6, 46705.0, 0.0)


@pytest.mark.parametrize("total, near", [("97871", [("DFD403", 2, "target")]), ("143771", [])])
def test_seed_near_capacity_depends_on_the_card(total, near):
    from dflash_doctor.gpus.csv_snapshot import parse_memory_total

    report = snapshot("seed003_snapshot.csv", SEED_ROLES, memory_total_mib=parse_memory_total(total))
    assert found(report) == sorted(SEED_FINDINGS + near)
    assert report.facts["skipped_checks"] == []


def test_seed_without_roles_compares_every_gpu_with_every_other():
    assert found(snapshot("seed003_snapshot.csv")) == [
        ("DFD401", 5, "all"), ("DFD402", 0, "all"), ("DFD402", 3, "all"), ("DFD402", 4, "all")]


@pytest.mark.parametrize("name, roles, columns, expected", [
    ("h100_header_with_total.csv", "target=0-3,drafter=4-5", None,
     [("DFD402", 2, "target"), ("DFD403", 1, "target")]),
    ("a100_noheader_5col.csv", "target=0-3,drafter=4-5", "index,name,memory.used,memory.total,utilization.gpu",
     [("DFD402", 2, "target")]),
    ("smi_loop_nounits.csv", None, None, [("DFD401", 1, "all"), ("DFD405", 2, "all")]),
    ("malformed.csv", None, None, [("DFD401", 5, "all")]),
])
def test_other_topologies(name, roles, columns, expected):
    assert found(snapshot(name, roles, columns)) == expected


def test_thresholds_are_options():
    loose = Thresholds(idle_util=10.0)
    report = snapshot("seed003_snapshot.csv", SEED_ROLES, thresholds=loose)
    # GPU 3 at 6 % is now idle (DFD401) and no longer listed as imbalance
    assert ("DFD401", 3, "target") in found(report) and ("DFD402", 3, "target") not in found(report)
    strict = Thresholds(imbalance_gap=95.0)
    assert [c for c, *_ in found(snapshot("seed003_snapshot.csv", SEED_ROLES, thresholds=strict))] == ["DFD401"]


def test_roles_naming_absent_gpus_are_a_problem():
    report = snapshot("seed003_snapshot.csv", "target=0-4,drafter=5-9")
    assert [(p.subject, p.reason) for p in report.problems] == [
        ("--roles", "role 'drafter' names GPU 8, 9, not in the snapshot")]
    assert report.exit_code() == 5


@pytest.mark.parametrize("values, level", [
    ([100, 100, 11, 6, 11], 100.0), ([0, 85, 100], 92.5), ([50, 10], 50.0), ([70], None), ([], None),
    ([90, 92, 94, 96, 10, 10, 10, 10], 93.0),
])
def test_busy_level_is_the_median_of_the_busiest_half(values, level):
    assert busy_level(values) == level


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 140000)), min_size=1, max_size=12), st.randoms())
def test_findings_do_not_depend_on_row_order(gpus, rnd: random.Random):
    readings = [GpuReading(i, utilization=u, memory_used_mib=m, memory_total_mib=141000.0)
                for i, (u, m) in enumerate(gpus)]
    shuffled = readings[:]
    rnd.shuffle(shuffled)
    assert found(analyze_gpus(readings)) == found(analyze_gpus(shuffled))


@pytest.mark.parametrize("rule", [r for r in all_rules() if r.example_format == "nvidia-smi-csv"],
                         ids=lambda r: r.code)
def test_rule_examples_run(rule):
    from dflash_doctor.gpus.examples import run_example

    bad, good = run_example(rule.bad), run_example(rule.good)
    assert rule.code in {f.code for f in bad.findings} and not bad.problems
    assert good.findings == [] and good.problems == []


def test_every_gpu_rule_has_a_runnable_example():
    # Read from the table, not a typed list of codes: every rule rules/gpus.py declares is written as a snapshot,
    # so test_rule_examples_run above runs it through the analyzers, and a new DFD4xx rule needs no edit here.
    declared = {value.code for value in vars(gpus_table).values() if isinstance(value, Rule)}
    assert declared and declared == {r.code for r in all_rules() if r.example_format == "nvidia-smi-csv"}

"""CSV snapshots (units, headers, repeated samples, malformed lines) and --roles / --map parsing."""
from __future__ import annotations

import pytest

from dflash_doctor.errors import UsageError
from dflash_doctor.gpus.csv_snapshot import (
    SEED_COLUMNS,
    BadValue,
    parse_columns,
    parse_memory_total,
    parse_mib,
    parse_percent,
    read_csv_snapshot,
)
from dflash_doctor.gpus.roles import gpu_for_thread, parse_roles, parse_thread_map
from tests.conftest import REPO

FIXTURES = REPO / "fixtures" / "gpus"


def read(name, columns=None):
    with open(FIXTURES / name, encoding="utf-8") as handle:
        return read_csv_snapshot(handle, name, columns)


@pytest.mark.parametrize("text, mib", [
    ("74989 MiB", 74989.0), ("74989", 74989.0), ("2 GiB", 2048.0), ("1024 KiB", 1.0), ("[N/A]", None),
    ("[Not Supported]", None), ("N/A", None), (" 96783MiB ", 96783.0),
])
def test_memory_values(text, mib):
    assert parse_mib(text) == mib


@pytest.mark.parametrize("text, percent", [("11 %", 11.0), ("100", 100.0), ("0 %", 0.0), ("[N/A]", None)])
def test_percent_values(text, percent):
    assert parse_percent(text) == percent


@pytest.mark.parametrize("text", ["ninety", "12 parsecs", "11 MiB%"])
def test_bad_values_raise(text):
    with pytest.raises(BadValue):
        parse_mib(text)


def test_memory_total_flag_units():
    assert parse_memory_total("97871") == 97871.0
    assert parse_memory_total("96GiB") == 96 * 1024.0
    assert parse_memory_total("141GB") == pytest.approx(141e9 / 2 ** 20)
    for bad in ("lots", "0", "-5"):
        with pytest.raises(UsageError):
            parse_memory_total(bad)


def test_seed_snapshot_reads_as_is():
    snap = read("seed003_snapshot.csv")
    assert snap.columns == SEED_COLUMNS and not snap.header and not snap.problems
    assert [(r.index, r.memory_used_mib, r.utilization, r.line) for r in snap.readings] == [
        (0, 74989.0, 11.0, 1), (1, 82027.0, 100.0, 2), (2, 96783.0, 100.0, 3), (3, 73723.0, 6.0, 4),
        (4, 86139.0, 11.0, 5), (5, 46705.0, 0.0, 6), (6, 77903.0, 85.0, 7), (7, 81247.0, 100.0, 8),
    ]


def test_header_with_units_names_and_missing_values():
    snap = read("h100_header_with_total.csv")
    assert snap.header and snap.columns == ("index", "name", "memory.used", "memory.total", "utilization.gpu")
    gpu5 = snap.readings[5]
    assert (gpu5.utilization, gpu5.memory_total_mib, gpu5.name) == (None, 81559.0, "NVIDIA H100 80GB HBM3")


def test_repeated_rows_are_averaged_samples_and_repeated_headers_skipped():
    snap = read("smi_loop_nounits.csv")
    assert not snap.problems and snap.rows == 12
    gpu1 = snap.readings[1]
    assert (gpu1.samples, gpu1.utilization, gpu1.memory_used_mib, gpu1.line) == (3, 1.0, 70112.0, 3)
    assert snap.readings[3].memory_used_mib == 69020.0  # peak, not mean: capacity is about the peak


def test_malformed_lines_are_problems_with_line_numbers_and_the_rest_is_read():
    snap = read("malformed.csv")
    assert [p.subject for p in snap.problems] == ["malformed.csv:2", "malformed.csv:3", "malformed.csv:4"]
    assert [r.index for r in snap.readings] == [0, 4, 5]


def test_headerless_with_other_field_count_needs_columns():
    with pytest.raises(UsageError, match="--columns"):
        read("a100_noheader_5col.csv")
    snap = read("a100_noheader_5col.csv", parse_columns("index,name,memory.used,memory.total,utilization.gpu"))
    assert [r.memory_total_mib for r in snap.readings] == [40960.0] * 6


def test_columns_must_name_the_required_fields():
    with pytest.raises(UsageError, match="utilization.gpu"):
        parse_columns("index,memory.used")
    with pytest.raises(UsageError, match="no utilization.gpu"):
        read_csv_snapshot(["index, memory.used [MiB]\n", "0, 10 MiB\n"], "x.csv")


@pytest.mark.parametrize("spec, roles", [
    ("target=0-4,drafter=5-7", {"target": (0, 1, 2, 3, 4), "drafter": (5, 6, 7)}),
    ("target=0,1,3-4,drafter=2", {"target": (0, 1, 3, 4), "drafter": (2,)}),
    (" a = 7 , b=0-1 ", {"a": (7,), "b": (0, 1)}),
    (None, {}),
])
def test_roles(spec, roles):
    assert parse_roles(spec) == roles


@pytest.mark.parametrize("spec", ["", "target", "0-4", "target=4-0", "target=0-4,drafter=4-5", "t=1,,d=2",
                                  "t=x", "t=1,t=2", "=1", "t=1-"])
def test_malformed_roles_are_usage_errors(spec):
    with pytest.raises(UsageError, match="--roles"):
        parse_roles(spec)


def test_thread_to_gpu_mapping_rule_and_overrides():
    roles = parse_roles("target=0-4,drafter=5-7")
    assert [gpu_for_thread(f"drafter-{n}", roles) for n in range(4)] == [5, 6, 7, None]
    assert gpu_for_thread("target_3", roles) == 3
    assert gpu_for_thread("main", roles) is None
    assert gpu_for_thread("drafter-0", parse_roles("drafter=7,6,5")) == 7  # listed order, not sorted
    overrides = parse_thread_map(["drafter-0=6", "loader=2,main=1"])
    assert overrides == {"drafter-0": 6, "loader": 2, "main": 1}
    assert gpu_for_thread("drafter-0", roles, overrides) == 6
    for bad in ("drafter-0", "drafter-0=x", "=5"):
        with pytest.raises(UsageError, match="--map"):
            parse_thread_map([bad])

"""Idle GPUs read the right way round (a crashed rank's empty GPU; a job still loading), and every input bounded:
devices, endless stdin, huge snapshots and ranges, out-of-range values, NaN options."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dflash_doctor.gpus.analyze import analyze_gpus
from dflash_doctor.gpus.nvml import PynvmlDevices
from dflash_doctor.gpus.processes import ProcessInfo
from dflash_doctor.gpus.readings import GpuReading
from dflash_doctor.gpus.roles import parse_roles
from dflash_doctor.gpus.sources import report_from_csv, report_from_nvml
from tests.conftest import REPO, run_cli
from tests.gpus.fakes import FakePynvml


def codes(report):
    return sorted((f.code, f.evidence["gpu"], f.severity.value) for f in report.findings)


def csv(text, roles=None):
    return report_from_csv(text.splitlines(keepends=True), "t.csv", roles=parse_roles(roles))


def test_an_empty_idle_gpu_beside_busy_role_peers_is_a_likely_dead_worker():
    # What a crashed rank looks like: its process exited and freed the GPU (or left a bare context), its peers
    # work on.
    for held in ("0 MiB", "512 MiB"):
        report = csv(f"0, 71002 MiB, 97 %\n1, {held}, 0 %\n2, 70994 MiB, 88 %\n", roles="rank=0-2")
        assert codes(report) == [("DFD405", 1, "warning")]
        assert report.findings[0].evidence["busy_peers"] == [0, 2]


def test_an_empty_gpu_outside_the_roles_is_nobodys_business():
    report = csv("0, 71002 MiB, 97 %\n1, 0 MiB, 0 %\n2, 70994 MiB, 88 %\n", roles="rank=0,2")
    assert codes(report) == []


def test_a_job_still_loading_is_information_from_one_snapshot():
    # Every GPU holds its weights and none works yet: one snapshot cannot tell loading from hanging.
    report = csv("0, 61002 MiB, 0 %\n1, 60890 MiB, 1 %\n2, 60112 MiB, 0 %\n", roles="target=0-2")
    assert codes(report) == [("DFD406", 0, "info")]
    assert report.findings[0].evidence["gpus"] == [0, 1, 2]
    assert report.exit_code() == 0  # info does not fail the default --fail-on warning


def test_staying_idle_over_several_csv_samples_is_a_warning():
    rows = "".join(f"{g}, 6100{g} MiB, 0 %\n" for _ in range(3) for g in range(2))
    report = csv(rows, roles="target=0-1")
    assert codes(report) == [("DFD406", 0, "warning")]
    assert report.findings[0].evidence["stayed"]


def loaded_idle():
    return FakePynvml({0: {"util": [0], "used": 61000, "total": 81559}, 1: {"util": [1], "used": 60000, "total": 81559}})


@pytest.mark.parametrize("samples, interval, severity", [(1, 1.0, "info"), (5, 0.5, "info"), (4, 15.0, "warning")])
def test_live_samples_must_span_time_to_call_idle_gpus_stuck(samples, interval, severity):
    slept = []
    report = report_from_nvml(samples=samples, interval=interval, sleep=slept.append,
                              open_devices=lambda: PynvmlDevices(loaded_idle()),
                              probe=lambda pid: ProcessInfo("running"))
    assert [(f.code, f.severity.value) for f in report.findings] == [("DFD406", severity)]
    assert sum(slept) == pytest.approx((samples - 1) * interval)


def test_no_dfd401_when_nothing_works_but_dfd401_when_a_peer_does():
    idle = [GpuReading(0, utilization=0.0, memory_used_mib=70000.0), GpuReading(1, utilization=0.0,
                                                                               memory_used_mib=70000.0)]
    assert [f.code for f in analyze_gpus(idle).findings] == ["DFD406"]
    busy = [idle[0], GpuReading(1, utilization=95.0, memory_used_mib=70000.0)]
    assert [f.code for f in analyze_gpus(busy).findings] == ["DFD401"]


def test_out_of_range_values_are_problems_not_findings():
    report = csv("0, 70000 MiB, 97 %\n1, 70000 MiB, -5 %\n2, 70000 MiB, 250 %\n3, -100 MiB, 50 %\n4, 70000 MiB, 96 %\n")
    assert codes(report) == []  # no bogus DFD402 from -5 % or 250 %
    assert [(p.subject, p.reason) for p in report.problems] == [
        ("t.csv:2", "utilization '-5 %' is outside 0-100 %"), ("t.csv:3", "utilization '250 %' is outside 0-100 %"),
        ("t.csv:4", "memory '-100 MiB' is negative")]


def test_a_ten_thousand_row_snapshot_is_read_and_malformed_lines_are_capped():
    rows = "".join(f"{i % 8}, 70000 MiB, {90 + i % 7} %\n" for i in range(10_000))
    report = csv(rows + "garbage\n" * 500)
    assert report.facts["rows"] == 10_000 and [r["samples"] for r in report.facts["gpus"]] == [1250] * 8
    assert len(report.problems) == 21 and report.problems[-1].reason == "480 more malformed lines"


@pytest.mark.timeout(60)
def test_dev_zero_and_an_endless_stdin_stop_at_once():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    # A device named by --from is refused before any reading (docs/robustness.md: exit 2, one line)
    proc = run_cli("gpus", "--from", "/dev/zero", timeout=30)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is a character device" in proc.stderr
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open("/dev/zero", "rb") as zeros:
        piped = subprocess.run([sys.executable, "-m", "dflash_doctor", "gpus", "--from", "-"], stdin=zeros,
                               capture_output=True, text=True, timeout=30, env=env, cwd=REPO)
    assert piped.returncode == 4 and "binary data" in piped.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, says", [
    (["--roles", "target=0-999999999999"], "--roles: GPU 999999999999 is beyond 1023"),
    (["--idle-util", "nan"], "--idle-util must be a finite number"),
    (["--idle-util", "101"], "--idle-util"),
    (["--near-capacity", "inf"], "--near-capacity must be a finite number"),
    (["--imbalance-ratio", "0"], "--imbalance-ratio"),
    (["--busy-util", "-1"], "--busy-util"),
    (["--interval", "nan"], "--interval must be a finite number"),
])
def test_bad_options_are_one_line_usage_errors(args, says):
    proc = run_cli("gpus", "--from", REPO / "fixtures" / "gpus" / "seed003_snapshot.csv", *args)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and says in proc.stderr, proc.stderr

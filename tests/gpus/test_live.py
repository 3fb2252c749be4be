"""Live mode: the guarded NVML entry point (fake pynvml), averaging, lost GPUs, processes via real psutil."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from dflash_doctor.findings import Report
from dflash_doctor.gpus.nvml import NvmlUnavailable, PynvmlDevices, iter_samples, sample_live
from dflash_doctor.gpus.processes import ProcessInfo, describe_processes, psutil_probe
from dflash_doctor.gpus.roles import parse_roles
from dflash_doctor.gpus.sources import report_from_nvml
from dflash_doctor.render import OutputFormat
from tests.gpus.fakes import FakePynvml

GIB = 2 ** 30


def seedlike():
    return FakePynvml({
        0: {"util": [100, 90, 95], "used": 80000, "total": 143771, "procs": [(101, 80000 * 2 ** 20)]},
        1: {"util": [0, 0, 0], "used": 46705, "total": 143771, "procs": [(102, 46705 * 2 ** 20)]},
        2: {"util": [97, 99, 98], "used": 140000, "total": 143771, "procs": [(103, None)]},
    })


def states(mapping):
    return lambda pid: ProcessInfo(mapping.get(pid, "gone"), name="python", threads=4)


def test_samples_are_averaged_with_the_interval_between_them():
    nvml, slept = seedlike(), []
    snap = sample_live(PynvmlDevices(nvml), samples=3, interval=0.2, sleep=slept.append)
    assert slept == [0.2, 0.2]  # between samples, not after the last
    assert [(r.index, r.utilization, r.samples) for r in snap.readings] == [(0, 95.0, 3), (1, 0.0, 3), (2, 98.0, 3)]
    assert snap.readings[2].processes[0].used_mib is None  # NVML's N/A per-process memory


def test_live_report_finds_idle_near_capacity_and_zombie():
    report = report_from_nvml(samples=3, interval=0.0, sleep=lambda s: None, open_devices=lambda: PynvmlDevices(
        seedlike()), probe=states({101: "running", 102: "zombie", 103: "sleeping"}),
        roles=parse_roles("drafter=0-2"))
    assert sorted((f.code, f.evidence["gpu"]) for f in report.findings) == [
        ("DFD401", 1), ("DFD403", 2), ("DFD404", 1)]
    gone = next(f for f in report.findings if f.code == "DFD404")
    assert (gone.evidence["pid"], gone.evidence["process_state"], gone.evidence["role"]) == (102, "zombie", "drafter")
    assert report.facts["samples"] == 3 and report.facts["source"] == "nvml"
    assert report.facts["gpus"][0]["processes"] == [
        {"pid": 101, "used_mib": 80000.0, "name": "python", "threads": 4, "state": "running"}]


def test_missing_pid_counts_as_gone_only_in_a_shared_pid_namespace():
    shared = report_from_nvml(samples=1, interval=0, sleep=lambda s: None,
                              open_devices=lambda: PynvmlDevices(seedlike()),
                              probe=states({101: "running", 103: "running"}))
    assert [(f.code, f.evidence["pid"]) for f in shared.findings if f.code == "DFD404"] == [("DFD404", 102)]
    container = report_from_nvml(samples=1, interval=0, sleep=lambda s: None,
                                 open_devices=lambda: PynvmlDevices(seedlike()), probe=states({}))
    assert not [f for f in container.findings if f.code == "DFD404"]
    assert [p.subject for p in container.problems] == ["GPU processes"]


def test_a_failing_field_is_none_and_a_lost_gpu_is_a_placeholder():
    nvml = seedlike()
    nvml.broken = {0: {"utilization", "name"}}
    nvml.lost = {1}
    report = report_from_nvml(samples=2, interval=0, sleep=lambda s: None, open_devices=lambda: PynvmlDevices(nvml),
                              probe=states({101: "running", 103: "running"}))
    gpus = {g["index"]: g for g in report.facts["gpus"]}
    assert (gpus[0]["utilization"], gpus[0]["name"], gpus[0]["memory_used_mib"]) == (None, None, 80000.0)
    assert gpus[1]["lost"] is True and gpus[2]["utilization"] == 98.0
    assert [(p.subject, p.reason) for p in report.problems] == [
        ("GPU 1", "lost: NVML cannot reach it (handle: GPU is lost)")]
    assert nvml.shut


@pytest.mark.parametrize("nvml, reason", [
    (FakePynvml({}, init_error="Driver Not Loaded"), "NVML could not start (Driver Not Loaded)"),
    (FakePynvml({}), "NVML sees no GPU on this machine"),
])
def test_no_nvml_or_no_gpu_is_one_problem_not_a_crash(nvml, reason):
    report = report_from_nvml(samples=1, interval=0, sleep=lambda s: None,
                              open_devices=lambda: PynvmlDevices.open(nvml))
    assert [p.subject for p in report.problems] == ["nvml"] and report.problems[0].reason.startswith(reason)
    assert report.exit_code() == 4


def test_real_pynvml_on_this_machine_is_a_problem():
    pytest.importorskip("pynvml")
    try:
        PynvmlDevices.open().shutdown()
        pytest.skip("this machine has a working NVML")
    except NvmlUnavailable as exc:
        assert "NVML" in str(exc)
    report = report_from_nvml(samples=1, interval=0, sleep=lambda s: None)
    assert report.exit_code() == 4 and report.problems[0].subject == "nvml"


def test_iter_samples_until_stopped_yields_running_averages():
    rounds = iter_samples(PynvmlDevices(seedlike()), None, 0.0, lambda s: None)
    utils = [next(rounds).readings[0].utilization for _ in range(3)]
    assert utils == [100.0, 95.0, 95.0]


def test_watch_redraws_after_every_sample_and_reports_once():
    from dflash_doctor.commands.gpus import live_report
    from dflash_doctor.gpus.analyze import Thresholds

    from rich.console import Console

    screen = io.StringIO()
    report = live_report(3, 0.0, True, OutputFormat.TEXT, parse_roles("drafter=0-2"), Thresholds(), None,
                         open_devices=lambda: PynvmlDevices(seedlike()), sleep=lambda s: None,
                         console=Console(file=screen, force_terminal=True, width=120))
    assert isinstance(report, Report) and report.facts["samples"] == 3
    assert sorted((f.code, f.evidence["gpu"]) for f in report.findings) == [("DFD401", 1), ("DFD403", 2)]
    assert report.problems[0].subject == "GPU processes"  # the fake PIDs do not exist on this machine
    assert screen.getvalue().count("drafter") >= 3 * 3  # the table (3 drafter rows) was drawn after each sample


def test_real_psutil_probe_running_reaped_and_zombie():
    me = psutil_probe(os.getpid())
    assert me.state in ("running", "sleeping") and me.threads >= 1 and me.name
    import time

    import psutil

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    # exited but not reaped yet: a zombie (psutil's own wait() would reap it, so poll the status instead)
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "child did not exit"
        time.sleep(0.05)
    assert psutil_probe(child.pid).state == "zombie"
    child.wait(timeout=30)
    assert psutil_probe(child.pid).state == "gone"


def test_describe_probes_each_pid_once():
    from dflash_doctor.gpus.readings import GpuProcess, GpuReading

    seen = []

    def probe(pid):
        seen.append(pid)
        return ProcessInfo("running", name="trainer", threads=12)

    readings = [GpuReading(0, processes=(GpuProcess(7),)), GpuReading(1, processes=(GpuProcess(7), GpuProcess(8)))]
    described = describe_processes(readings, probe)
    assert seen == [7, 8]
    assert described[1].processes[0] == GpuProcess(7, name="trainer", threads=12, state="running")

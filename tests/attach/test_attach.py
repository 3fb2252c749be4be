"""`dflash-doctor attach PID` against a real hung process (real threads, real locks, real py-spy); NVML and a
ptrace refusal, which this machine lacks, come from small stand-ins."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from dflash_doctor.errors import MissingDependency
from dflash_doctor.gpus.nvml import PynvmlDevices
from dflash_doctor.supervise.attach import AttachSpec, PtraceDenied, attach
from tests.gpus.fakes import FakePynvml
from tests.run.helpers import program, read_line_with


@pytest.fixture
def hung_process():
    proc = subprocess.Popen([sys.executable, program("lock_cycle.py")], stdout=subprocess.PIPE, text=True)
    try:
        read_line_with(proc.stdout, "ready")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.timeout(120)
def test_attach_names_the_lock_cycle_of_a_process_not_started_under_run(cli, hung_process, tmp_path):
    out = tmp_path / "attach.json"
    proc = cli("attach", hung_process, "--samples", "2", "--interval", "0.5", "-f", "json", "-o", out, timeout=100)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""
    doc = json.loads(out.read_text())
    finding, = doc["findings"]
    assert finding["code"] == "DFD903"
    assert sorted(finding["evidence"]["threads"]) == ["loader", "trainer"]
    assert any("LOAD_LOCK" in step and "STEP_LOCK" in step for step in finding["evidence"]["chain"])
    process, = doc["facts"]["processes"]
    assert process["pid"] == hung_process and {"loader", "trainer"} <= set(process["still"])
    assert doc["facts"]["gpus"].startswith("unavailable")  # no NVIDIA driver on this machine


@pytest.mark.timeout(120)
def test_attach_names_the_gpu_each_process_holds(hung_process):
    nvml = FakePynvml({0: {"util": [0], "used": 900, "total": 81920, "procs": [(hung_process, 900 * 2 ** 20)]}})
    report = attach(AttachSpec(hung_process, samples=2, interval_s=0.3),
                    open_nvml=lambda: PynvmlDevices.open(module=nvml))
    finding, = report.findings
    assert finding.evidence["gpus"] == [0] and finding.message.endswith("It holds GPU 0.")
    assert nvml.shut


def test_missing_py_spy_is_one_line_naming_the_extra(cli, hung_process):
    # Neither on PATH nor beside the interpreter (pipx, a venv not activated): the one line names the package.
    with pytest.raises(MissingDependency) as caught:
        attach(AttachSpec(hung_process), which=lambda name: None, beside=lambda: [])
    assert "pip install py-spy" in str(caught.value) and caught.value.exit_code == 4
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.exists(beside):
        return  # this interpreter has py-spy beside it: an empty PATH still finds it (the pipx case)
    proc = cli("attach", hung_process, env={"PATH": os.path.dirname(sys.executable) + "/no-such-folder"},
               timeout=60)
    assert proc.returncode == 4
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install py-spy" in lines[0]


def test_no_such_pid_is_a_usage_error(cli):
    proc = cli("attach", "999999999", timeout=60)
    assert proc.returncode == 2 and "no process with pid 999999999" in proc.stderr


def test_ptrace_refused_says_what_to_change(hung_process):
    # This machine lets root trace anything; py-spy's answer where ptrace is refused stands in for the kernel.
    def refused(argv, timeout):
        return subprocess.CompletedProcess(argv, 1, "", "Error: Permission Denied: Try running again with elevated "
                                                          "permissions by going 'sudo env \"PATH=$PATH\" !!'\n")

    with pytest.raises(PtraceDenied) as caught:
        attach(AttachSpec(hung_process), runner=refused)
    assert "kernel.yama.ptrace_scope" in str(caught.value) and "--cap-add SYS_PTRACE" in str(caught.value)
    assert caught.value.exit_code == 4


@pytest.mark.timeout(120)
def test_attach_subprocesses_reads_the_children_of_a_launcher(cli, tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, "
                                 f"{program('lock_cycle.py')!r}])"], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        worker = int(read_line_with(launcher.stdout, "ready").split()[1])
        out = tmp_path / "attach.json"
        proc = cli("attach", launcher.pid, "--subprocesses", "--interval", "0.5", "-f", "json", "-o", out,
                   timeout=100)
    finally:
        if worker is not None:
            os.kill(worker, signal.SIGKILL)
        launcher.kill()
        launcher.wait(30)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(out.read_text())
    assert {p["pid"] for p in doc["facts"]["processes"]} == {launcher.pid, worker}
    finding, = doc["findings"]
    assert finding["evidence"]["pid"] == worker and finding["code"] == "DFD903"


@pytest.mark.timeout(120)
def test_a_cycle_that_forms_between_samples_is_sampled_until_it_stands():
    """The H200 case: the first samples see the threads running, the last one the cycle just formed; attach
    samples again instead of giving up, and names the cycle once it has stood still across two samples."""
    proc = subprocess.Popen([sys.executable, program("lock_cycle.py"), "--when-told"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        read_line_with(proc.stdout, "ready")
        sleeps = []

        def sleep_forming_the_cycle(seconds):
            if not sleeps:  # between the first and the second sample: let the threads deadlock now
                proc.stdin.write("go\n")
                proc.stdin.flush()
                read_line_with(proc.stdout, "locked")
            sleeps.append(seconds)

        report = attach(AttachSpec(proc.pid, samples=2, interval_s=0.2), sleep=sleep_forming_the_cycle)
        finding, = report.findings
        assert finding.code == "DFD903"
        assert sorted(finding.evidence["threads"]) == ["loader", "trainer"]
        process, = report.facts["processes"]
        assert process["samples"] == 3 and process["cycle_threads_still"]
        assert report.problems == []
    finally:
        proc.kill()
        proc.wait(30)

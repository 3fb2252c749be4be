"""Ctrl-C and SIGTERM stop a command and everything it started within 5 s, remove its temporary folders, and
still write what it had; no orphan keeps training, no traceback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import psutil
import pytest

from tests.robustness.harness import (
    cli_env,
    descendants_with_real_torch,
    processes_in,
    wait_for,
)

STOP_BOUND_S = 5.0


_STARTED: List[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _no_command_outlives_its_test():
    """A test that fails before it signals its command (a wait that timed out under load) must not leave it
    training: a 100,000-step pipeline left behind once loaded the machine for the rest of the session."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(30)


def _start(args, tmp_path: Path) -> subprocess.Popen:
    env = cli_env({"TMPDIR": str(tmp_path)})
    proc = subprocess.Popen([sys.executable, "-m", "dflash_doctor", *map(str, args)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _STARTED.append(proc)
    return proc


def _family(pid: int) -> List[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _stop_and_watch(proc: subprocess.Popen, signum: int):
    """Send `signum` to the command alone (as `kill PID` or a terminal's Ctrl-C to the foreground process
    would reach it); return (exit code, stdout, stderr, descendants still alive after the bound)."""
    family = _family(proc.pid)
    try:
        os.kill(proc.pid, signum)
        try:
            stdout, stderr = proc.communicate(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            for process in family + [psutil.Process(proc.pid)]:  # the workers hold the pipes open too
                _kill(process)
            stdout, stderr = proc.communicate()
            name = signal.Signals(signum).name
            raise AssertionError(f"still running {STOP_BOUND_S:g}s after {name}: {stderr[-2000:]}")
        _, alive = psutil.wait_procs(family, timeout=max(0.1, STOP_BOUND_S - 1))
        return proc.returncode, stdout, stderr, alive
    finally:
        for process in family:
            _kill(process)


def _kill(process: psutil.Process) -> None:
    try:
        process.kill()
    except psutil.NoSuchProcess:
        pass


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_following_a_log_stops_on_a_signal_with_the_report(tmp_path, signum, code):
    log = tmp_path / "train.log"
    log.write_text("drafter-0 step=1 loss=2.0 tok/s=100\n")
    proc = _start(["logs", log, "--follow", "-f", "json"], tmp_path)
    wait_for(lambda: any(f.path == str(log) for f in psutil.Process(proc.pid).open_files()), 20, "the log opened")
    returncode, stdout, stderr, alive = _stop_and_watch(proc, signum)
    assert "Traceback" not in stderr, stderr
    assert json.loads(stdout)["command"] == "logs"  # what was read is reported
    assert returncode in (0, code), (returncode, stderr)


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(120)
def test_sigterm_to_a_process_pipeline_stops_every_worker(tmp_path):
    proc = _start(["pipeline", "--device", "cpu", "--preset", "tiny", "--steps", "100000", "--workers", "processes",
                   "-f", "json"], tmp_path)
    wait_for(lambda: len(descendants_with_real_torch(proc.pid)) >= 2 or proc.poll() is not None, 90,
             "the workers to start")
    returncode, stdout, stderr, alive = _stop_and_watch(proc, signal.SIGTERM)
    assert not alive, f"orphans: {alive}"
    assert returncode == 143 and "Traceback" not in stderr, stderr
    assert json.loads(stdout)["command"] == "pipeline"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_repro_stops_its_child_and_removes_its_folder(tmp_path, signum, code):
    proc = _start(["repro", "--mode", "forced", "--device", "cpu", "--threads", "2", "--timeout", "120",
                   "--hang-after", "60", "-f", "json"], tmp_path)
    wait_for(lambda: descendants_with_real_torch(proc.pid) or proc.poll() is not None, 90, "the phase child")
    time.sleep(0.5)
    returncode, stdout, stderr, alive = _stop_and_watch(proc, signum)
    assert not alive, f"orphans: {alive}"
    assert returncode == code and "Traceback" not in stderr, stderr
    assert not list(tmp_path.glob("dflash-repro-*")), "temporary folder left behind"


def _start_json(args, tmp_path: Path) -> subprocess.Popen:
    (tmp_path / "train.py").write_text("import torch\ntorch.utils.checkpoint.checkpoint(f, x)\n", encoding="utf-8")
    return _start(args, tmp_path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_check_leaves_no_probe_and_writes_the_parts_that_finished(tmp_path, signum, code):
    """The probe host and the probes it forked run in a session of their own: a signal to check reaches none of
    them, so check must end them (children.py's registry), even while a thread of its own waits on them."""
    proc = _start_json(["check", ".", "--timeout", "60", "-f", "json"], tmp_path)
    wait_for(lambda: descendants_with_real_torch(proc.pid) or proc.poll() is not None, 90, "the probe host")
    returncode, stdout, stderr, _ = _stop_and_watch(proc, signum)
    time.sleep(1)  # the bound is counted from the signal: _stop_and_watch waited for the exit already
    assert not processes_in(tmp_path), f"left running: {processes_in(tmp_path)}"
    assert returncode == code and "Traceback" not in stderr, stderr
    document = json.loads(stdout)
    assert document["facts"]["partial"]["stopped_by"] == signal.Signals(signum).name
    assert "scan" in document["facts"]["parts"] and "DFD102" in [f["code"] for f in document["findings"]]


@pytest.mark.timeout(120)
def test_ctrl_c_to_report_leaves_no_probe(tmp_path):
    proc = _start_json(["report", "train.py"], tmp_path)
    wait_for(lambda: descendants_with_real_torch(proc.pid) or proc.poll() is not None, 90, "the probe host")
    returncode, _, stderr, _ = _stop_and_watch(proc, signal.SIGINT)
    time.sleep(1)
    assert not processes_in(tmp_path), f"left running: {processes_in(tmp_path)}"
    assert returncode == 130 and "Traceback" not in stderr, stderr


def _read_stderr_until(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """What the command wrote to stderr until `text` appeared (it keeps running)."""
    import select

    fd = proc.stderr.fileno()  # read below the text layer, which cannot read a pipe that has nothing yet
    seen = b""
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        if time.monotonic() > deadline or proc.poll() is not None:
            raise AssertionError(f"no {text!r} on stderr within {timeout:g}s: {seen[-2000:]!r}")
        if select.select([fd], [], [], 0.2)[0]:
            seen += os.read(fd, 65536)
    return seen.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_signal_during_a_real_matrix_keeps_the_finished_rows(tmp_path):
    """Issue 27: a matrix that ran for minutes lost everything on SIGTERM. The row without a mitigation ends
    first (its forced trial reproduces in seconds); the signal comes while the next row runs."""
    proc = _start(["repro", "--matrix", "--device", "cpu", "--mode", "forced", "--threads", "2", "--steps", "1",
                   "--trials", "1", "--timeout", "120", "-f", "json"], tmp_path)
    _read_stderr_until(proc, "(mitigation none): reproduced (fx-flag-leak)", 180)
    returncode, stdout, stderr, alive = _stop_and_watch(proc, signal.SIGTERM)
    assert not alive, f"orphans: {alive}"
    assert returncode == 143 and "Traceback" not in stderr, stderr
    facts = json.loads(stdout)["facts"]
    assert facts["partial"]["stopped_by"] == "SIGTERM"
    finished = {row["mitigation"]: row for row in facts["matrix"] if row["finished"]}
    assert finished["none"]["verdict"] == "reproduced", facts["matrix"]
    assert facts["verdict"] == "reproduced"
    assert not list(tmp_path.glob("dflash-repro-*")), "temporary folder left behind"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("when, wait_for_text", [
    ("set-up", "corpus"), pytest.param("training", "step=", marks=pytest.mark.slow)])  # (training: end to end)
def test_ctrl_c_stops_a_threads_pipeline_within_the_bound(tmp_path, when, wait_for_text):
    proc = _start(["pipeline", "--device", "cpu", "--preset", "tiny", "--steps", "100000", "-f", "json"], tmp_path)
    _read_stderr_until(proc, wait_for_text, 90)
    returncode, stdout, stderr, _ = _stop_and_watch(proc, signal.SIGINT)  # fails past STOP_BOUND_S
    assert returncode == 130 and "Traceback" not in stderr, stderr
    assert json.loads(stdout)["facts"]["interrupted"] == "SIGINT"


@pytest.mark.timeout(120)
def test_a_signal_to_repro_dataparallel_stops_its_form_child_and_removes_its_folder(tmp_path):
    proc = _start(["repro", "--mode", "dataparallel", "--device", "cpu", "--threads", "3", "--timeout", "100",
                   "-f", "json"], tmp_path)
    wait_for(lambda: descendants_with_real_torch(proc.pid) or proc.poll() is not None, 90, "the form's child")
    time.sleep(0.5)
    returncode, stdout, stderr, alive = _stop_and_watch(proc, signal.SIGTERM)
    assert not alive, f"orphans: {alive}"
    assert returncode == 143 and "Traceback" not in stderr, stderr
    assert not list(tmp_path.glob("dflash-dataparallel-*")), "temporary folder left behind"

"""attach compares locks by object too (py-spy --locals gives the address of the local a lock expression starts
from): a ring of three locks and a deadlock through `.acquire()` are named, the same way in every sample, and two
threads queued behind a slow holder are no cycle (real processes, real threads, real py-spy)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.run.helpers import program, read_line_with


def _attach(cli, pid, tmp_path, *extra):
    out = tmp_path / "attach.json"
    proc = cli("attach", pid, "--samples", "3", "--interval", "0.4", *extra, "-f", "json", "-o", out, timeout=100)
    return proc, json.loads(out.read_text())


@pytest.fixture
def started():
    procs = []

    def start(name, *args):
        proc = subprocess.Popen([sys.executable, program(name), *args], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        read_line_with(proc.stdout, "ready")
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(30)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script, threads", [
    ("lock_ring.py", ["stage-0", "stage-1", "stage-2"]),
    ("acquire_transfer.py", ["pay-alice", "pay-bob"]),
])
def test_a_ring_of_three_locks_and_an_acquire_deadlock_are_named(cli, tmp_path, started, script, threads):
    proc, doc = _attach(cli, started(script), tmp_path)
    assert proc.returncode == 1, proc.stderr
    finding, = doc["findings"]
    assert finding["code"] == "DFD903" and sorted(finding["evidence"]["threads"]) == threads
    process, = doc["facts"]["processes"]
    assert process["cycle"] == "lock-cycle" and process["cycle_threads_still"]


@pytest.mark.timeout(120)
def test_two_threads_queued_behind_a_slow_holder_are_no_deadlock(cli, tmp_path, started):
    proc, doc = _attach(cli, started("slow_holder.py", "60"), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert doc["findings"] == [] and doc["problems"] == []
    process, = doc["facts"]["processes"]
    assert {"reader-0", "reader-1", "refresher"} <= set(process["still"])  # still, yet no cycle
    assert process["cycle"] is None


@pytest.mark.timeout(120)
def test_a_launchers_python_child_is_hinted_when_subprocesses_was_not_asked(cli, tmp_path):
    launcher = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, "
                                 f"{program('lock_cycle.py')!r}])"], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(read_line_with(launcher.stdout, "ready").split()[1])
        proc, doc = _attach(cli, launcher.pid, tmp_path)
        text = cli("attach", launcher.pid, "--interval", "0.2", timeout=100)
    finally:
        subprocess.run(["kill", "-9", str(worker)], check=False)
        launcher.kill()
        launcher.wait(30)
    assert proc.returncode == 0 and doc["findings"] == []
    assert doc["facts"]["python_children"] == [worker]
    assert f"Python child process(es) {worker}" in text.stdout and "--subprocesses" in text.stdout


@pytest.mark.timeout(120)
def test_py_spy_beside_the_interpreter_is_used_when_path_does_not_have_it(cli, tmp_path, started):
    import os

    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(beside):
        pytest.skip("py-spy is not installed beside this interpreter")
    out = tmp_path / "attach.json"
    proc = cli("attach", started("acquire_transfer.py"), "--interval", "0.3", "-f", "json", "-o", out,
               env={"PATH": "/usr/bin:/bin"}, timeout=100)  # a venv that is not activated: nothing on PATH
    assert proc.returncode == 1, proc.stderr
    assert json.loads(out.read_text())["findings"][0]["code"] == "DFD903"

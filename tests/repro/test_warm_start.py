"""Phase children forked from the warm-start server, for real: they give the verdicts fresh children give, each
compiles into caches of its own, a child whose environment differs where torch may have read it at import starts
fresh, and none outlives the server."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from dflash_doctor.repro import phase_record
from dflash_doctor.repro.harness import Harness
from dflash_doctor.repro.runner import ChildProcess, write_spec
from dflash_doctor.repro.spec import PhaseSpec, ReproSpec
from dflash_doctor.repro.warm_start import ForkedChild, WarmStartRunner

pytest.importorskip("torch")


def _phase(phase: str = "multi", mode: str = "forced", hold_s: float = 0.0) -> PhaseSpec:
    return PhaseSpec(phase=phase, threads=0 if phase == "disturb" else 2, devices=["cpu"], backward=False,
                     checkpoint="none", shape_indices=[] if phase == "disturb" else [0, 0], steps=1,
                     hang_after_s=30.0, mode=mode, mitigation=[], amplify_ms=0.0, preset="replay", model=None,
                     thread_names=[] if phase == "disturb" else ["drafter-0", "drafter-1"], disturb_hold_s=hold_s)


def _wait(child, timeout_s: float = 120.0):
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        ended = child.poll(300.0)
        if ended is not None:
            return ended
        time.sleep(0.05)
    raise AssertionError("the child never ended")


def _gone(pid: int, timeout_s: float = 15.0) -> bool:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_forked_trials_give_the_verdicts_of_the_ladder(tmp_path):
    """A baseline and a mitigation row under the forced stress, both children forked: the baseline reproduces the
    FX flag leak, the thread-local flag survives it; the same facts a fresh child gives (test_cli_repro.py)."""
    runner = WarmStartRunner(tmp_path)
    try:
        spec = ReproSpec(mode="forced", mitigation=("threadlocal-flag",), trials=1)
        report = Harness(spec, runner=runner, workdir=tmp_path).run()
    finally:
        runner.close()
    assert runner.forked == 2 and runner.started_fresh == 0, runner.unavailable
    facts = report.facts
    assert facts["baseline_levels"]["forced"]["kinds"] == {"fx-flag-leak": 1}
    # The shim was installed in the forked child as in a fresh one: no thread met the leaked flag. (Under a loaded
    # CI box the holder's trace once broke a compile's guards instead, as it can in a fresh child: the patcher
    # race, another hazard; the threads' errors are in the message.)
    forced = facts["levels"]["forced"]
    errors = [t["error"] for t in (facts["multi_thread"] or {}).get("threads", []) if t["error"]]
    assert forced["ran"] == 1 and "fx-flag-leak" not in forced["kinds"], errors
    assert facts["torch_version"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_each_forked_child_compiles_into_its_own_caches_and_ends_with_its_result(tmp_path):
    runner = WarmStartRunner(tmp_path)
    try:
        folders = []
        for index in range(2):
            folder = tmp_path / f"phase{index}"
            spec_path = write_spec(folder, _phase(mode="natural"))  # the steps compile and run
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor-cache"),
                   "PYTHONSAFEPATH": "1"}
            child = runner.start(spec_path, folder / "result.json", env, folder / "log.txt")
            assert isinstance(child, ForkedChild)
            assert psutil.Process(child.pid).ppid() == runner._server.popen.pid  # forked, not started afresh
            ended = _wait(child)
            assert not ended.timed_out
            folders.append(folder)
        for folder in folders:
            result = phase_record.read(folder / "result.json")
            assert result.outcome == "ok" and result.torch_version
            assert any((folder / "inductor-cache").rglob("*")), "the child compiled into another cache"
    finally:
        runner.close()


@pytest.mark.timeout(120)
def test_a_child_whose_environment_torch_may_have_read_differs_starts_fresh(tmp_path):
    runner = WarmStartRunner(tmp_path)
    try:
        folder = tmp_path / "phase"
        spec_path = write_spec(folder, _phase())
        first = runner.start(spec_path, folder / "result.json", dict(os.environ), folder / "log.txt")
        _wait(first)
        other = tmp_path / "other"
        spec_path = write_spec(other, _phase())
        fresh = runner.start(spec_path, other / "result.json", {**os.environ, "TORCH_LOGS": "dynamo"},
                             other / "log.txt")
        assert isinstance(fresh, ChildProcess) and runner.started_fresh == 1
        fresh.kill()
    finally:
        runner.close()


@pytest.mark.timeout(120)
def test_no_forked_child_outlives_its_server(tmp_path):
    """A disturbance child lingers after its result (it holds its trace for the workers); the server killed, it
    dies with it, and later children start fresh."""
    runner = WarmStartRunner(tmp_path)
    try:
        folder = tmp_path / "disturb"
        spec_path = write_spec(folder, _phase("disturb", hold_s=120.0))
        child = runner.start(spec_path, folder / "result.json", dict(os.environ), folder / "log.txt")
        assert isinstance(child, ForkedChild)
        began = time.monotonic()
        while not (folder / "result.json").exists() and time.monotonic() - began < 60:
            time.sleep(0.05)
        assert psutil.pid_exists(child.pid)
        os.kill(runner._server.popen.pid, signal.SIGKILL)
        assert _gone(child.pid), "the forked child outlived its server"
        later = tmp_path / "later"
        spec_path = write_spec(later, _phase())
        assert _gone(runner._server.popen.pid)
        runner._server.wait_until(lambda: False, 5.0)  # the reader sees the server's end
        fresh = runner.start(spec_path, later / "result.json", dict(os.environ), later / "log.txt")
        assert isinstance(fresh, ChildProcess)
        fresh.kill()
    finally:
        runner.close()


@pytest.mark.timeout(180)
def test_the_server_makes_the_compile_entry_imports_on_a_cpu_build_and_nothing_else_a_fork_would_lose():
    """What the server holds before its first fork, read in a fresh interpreter: on a CPU build torch.compile's
    own imports (inductor's compile_fx among them), one thread, no child process, CUDA untouched, and no compile
    (Dynamo's counters are empty)."""
    import subprocess
    import sys

    probe = ("import sys, threading, json, psutil, torch\n"
             "from dflash_doctor.repro import warm_start\n"
             "warm_start._preload(); warm_start._preload_compile_entry()\n"
             "from torch._dynamo.utils import counters\n"
             "print(json.dumps({'compile_fx': 'torch._inductor.compile_fx' in sys.modules,"
             " 'threads': threading.active_count(), 'children': len(psutil.Process().children()),"
             " 'cuda': torch.cuda.is_initialized(), 'gpu_build': torch.version.cuda is not None,"
             " 'frames': sum(counters['frames'].values())}))\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-2000:]
    held = json.loads(proc.stdout.strip().splitlines()[-1])
    assert held["compile_fx"] is not held["gpu_build"]  # a GPU build skips it (the device may be asked)
    assert (held["threads"], held["children"], held["cuda"], held["frames"]) == (1, 0, False, 0)


@pytest.mark.slow  # end to end, 3.4 s or more on the quiet 2-core box: the second test command
@pytest.mark.timeout(240)
def test_only_a_child_whose_compile_length_cannot_matter_keeps_the_servers_objects_out_of_its_collections(tmp_path):
    """The server freezes its imports' objects before it forks; a timing-free child (a shared-cache trial) keeps
    them frozen, every other child unfreezes them and collects as a fresh interpreter does."""
    runner = WarmStartRunner(tmp_path)
    try:
        frozen = {}
        for timing_free in (True, False):
            folder = tmp_path / f"free-{timing_free}"
            spec = _phase(mode="forced")
            spec.timing_free = timing_free
            spec_path = write_spec(folder, spec)
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor-cache")}
            child = runner.start(spec_path, folder / "result.json", env, folder / "log.txt")
            assert isinstance(child, ForkedChild)
            assert not _wait(child).timed_out
            frozen[timing_free] = phase_record.read(folder / "result.json").gc_frozen
    finally:
        runner.close()
    assert frozen[True] > 10_000 and frozen[False] == 0, frozen

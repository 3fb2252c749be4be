"""Each mitigation function on real threads; the thread-local FX shim and non-lazy backward on real torch, in a
child process (they change torch process-wide)."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from dflash_doctor.runtime.mitigations import first_call_lock, global_lock, warmup
from tests.conftest import REPO


class Overlap:
    """A step that records how many threads were inside it at once."""

    def __init__(self, sleep_s: float = 0.05) -> None:
        self.inside = 0
        self.peak = 0
        self.calls = []
        self._lock = threading.Lock()
        self._sleep = sleep_s

    def __call__(self, tag):
        with self._lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            self.calls.append(tag)
        time.sleep(self._sleep)
        with self._lock:
            self.inside -= 1
        return tag


def run_threads(target, count=3, timeout_s=20.0):
    threads = [threading.Thread(target=target, args=(i,), name=f"t{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
    assert not any(thread.is_alive() for thread in threads)


@pytest.mark.timeout(30)
def test_first_call_lock_serialises_only_each_threads_first_call():
    first_calls = Overlap()
    later_calls = Overlap(sleep_s=0.2)
    lock = threading.Lock()
    start_later = threading.Barrier(3)

    def step(tag):
        return (first_calls if tag[1] == 0 else later_calls)(tag)

    wrapped = first_call_lock(step, lock)

    def worker(index):
        assert wrapped((index, 0)) == (index, 0)
        start_later.wait(10)
        wrapped((index, 1))

    run_threads(worker)
    assert first_calls.peak == 1  # the first calls never overlapped
    assert later_calls.peak > 1  # later calls ran together, unlocked: why this mitigation is not enough
    assert len(later_calls.calls) == 3


@pytest.mark.timeout(30)
def test_first_call_lock_retries_the_lock_after_a_failing_first_call():
    calls = []
    lock = threading.Lock()

    def step():
        calls.append(lock.locked())
        if len(calls) == 1:
            raise RuntimeError("compile failed")

    wrapped = first_call_lock(step, lock)
    with pytest.raises(RuntimeError):
        wrapped()
    wrapped()
    wrapped()
    assert calls == [True, True, False]


@pytest.mark.timeout(30)
def test_global_lock_serialises_every_call_of_every_thread():
    step = Overlap(sleep_s=0.02)
    wrapped = global_lock(step, threading.RLock())

    def worker(index):
        for call in range(3):
            wrapped((index, call))

    run_threads(worker)
    assert step.peak == 1 and len(step.calls) == 9


def test_warmup_runs_each_step_once_in_the_calling_thread_and_times_it():
    ran = []
    ticks = iter([0.0, 1.5, 2.0, 2.25])
    seconds = warmup([lambda: ran.append(("a", threading.current_thread().name)),
                      lambda: ran.append(("b", threading.current_thread().name))], clock=lambda: next(ticks))
    me = threading.current_thread().name
    assert ran == [("a", me), ("b", me)]
    assert seconds == [1.5, 0.25]


SHIM_CHILD = '''
import json, threading
import torch, torch.fx
from dflash_doctor import runtime
from dflash_doctor.repro import disturb

out = {}
def call(fn):
    try:
        fn(torch.ones(2))
        return "ok"
    except RuntimeError as exc:
        return str(exc)

old = torch.compile(lambda t: t * 2, backend="eager")
old(torch.ones(2))
held = disturb.hold_fx_flag(30)
out["before_shim"] = call(old)
held.stop()

status = runtime.install_threadlocal_fx_flag()
out["status"] = status.to_dict()
out["again_same_object"] = runtime.install_threadlocal_fx_flag() is status
new = torch.compile(lambda t: t * 3, backend="eager")
new(torch.ones(2))
held = disturb.hold_fx_flag(30)
out["forced_new"] = call(new)
out["forced_old"] = call(old)
out["main_thread_tracing"] = runtime.thread_is_fx_tracing()
held.stop()
disturb.leave_fx_flag_stuck()
out["global_flag_after_stuck"] = torch.fx._symbolic_trace._is_fx_tracing_flag
out["stuck_new"] = call(new)
out["self_check"] = list(runtime.verify_threadlocal_fx_flag())

import torch._functorch.config as fc
out["non_lazy_before"] = fc.force_non_lazy_backward_lowering
out["non_lazy_previous"] = runtime.enable_non_lazy_backward()
out["non_lazy_after"] = fc.force_non_lazy_backward_lowering
print(json.dumps(out))
'''

FX_ERROR = ("Detected that you are using FX to symbolically trace a dynamo-optimized function. "
            "This is not supported at the moment.")


@pytest.fixture(scope="module")
def shim_child(tmp_path_factory):
    script = tmp_path_factory.mktemp("shim") / "shim_child.py"
    script.write_text(SHIM_CHILD)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(150)
def test_without_the_shim_a_held_fx_flag_breaks_another_threads_compiled_call(shim_child):
    assert shim_child["before_shim"] == FX_ERROR


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(150)
def test_the_shim_installs_once_and_counts_wrappers_created_before_it(shim_child):
    status = shim_child["status"]
    assert status["state"] == "installed"
    assert "torch.fx._symbolic_trace.is_fx_symbolic_tracing" in status["patched"]
    assert status["stale_wrappers"] == 1  # `old` was created before the shim
    assert shim_child["again_same_object"] is True


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(150)
def test_the_shim_makes_forced_and_stuck_harmless_for_wrappers_created_after_it(shim_child):
    assert shim_child["forced_new"] == "ok"
    assert shim_child["forced_old"] == FX_ERROR  # bound the old predicate at creation: why order matters
    assert shim_child["main_thread_tracing"] is False
    assert shim_child["global_flag_after_stuck"] is True  # torch's own global is still stuck...
    assert shim_child["stuck_new"] == "ok"  # ...but compiled calls no longer read it
    assert shim_child["self_check"][0] is True


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
@pytest.mark.timeout(150)
def test_enable_non_lazy_backward_sets_the_functorch_option(shim_child):
    assert (shim_child["non_lazy_before"], shim_child["non_lazy_previous"], shim_child["non_lazy_after"]) == (
        False, False, True)

"""The watchdog: fires once when progress is stale (fake clock), and on a genuine lock-order deadlock between two
real threads in a child process it reports the hang, classified as a lock cycle, within the time limit."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from dflash_doctor.outcomes import HangCycle
from dflash_doctor.runtime.watchdog import Watchdog
from tests.conftest import REPO


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_fires_once_when_progress_is_older_than_hang_after():
    clock, fired = FakeClock(), []
    last = {"t": 100.0}
    dog = Watchdog(lambda: last["t"], 5.0, fired.append, clock=clock, capture=lambda: [], cpu_seconds=None)
    clock.now = 104.9
    assert dog.check() is None
    last["t"] = 104.0  # progress resets the window
    clock.now = 108.9
    assert dog.check() is None
    clock.now = 109.5
    report = dog.check()
    assert report is not None and fired == [report]
    assert report.diagnosis.stalled_s == pytest.approx(5.5)
    clock.now = 200.0
    assert dog.check() is None and len(fired) == 1


def test_a_busy_cpu_counts_as_progress_and_an_idle_one_does_not():
    # An inductor compile goes seconds without an event but keeps a core busy; deadlocked threads use none.
    clock, fired, cpu = FakeClock(), [], {"s": 0.0}
    dog = Watchdog(lambda: 100.0, 5.0, fired.append, clock=clock, capture=lambda: [], cpu_seconds=lambda: cpu["s"])
    for _ in range(20):  # 20 s of compiling at half a core, no events
        clock.now += 1.0
        cpu["s"] += 0.5
        assert dog.check() is None
    for second in range(1, 6):  # then idle: fires once five idle seconds have passed
        clock.now += 1.0
        cpu["s"] += 0.01
        report = dog.check()
        assert (report is not None) == (second == 5)
    assert len(fired) == 1


DEADLOCK_CHILD = textwrap.dedent('''
    import json, os, sys, threading, time
    from dflash_doctor.runtime.watchdog import Watchdog

    lock_a, lock_b = threading.Lock(), threading.Lock()
    both_hold_one = threading.Barrier(2)
    progress = {"t": time.perf_counter()}

    def take_ab():
        with lock_a:
            both_hold_one.wait()
            with lock_b:
                progress["t"] = time.perf_counter()

    def take_ba():
        with lock_b:
            both_hold_one.wait()
            with lock_a:
                progress["t"] = time.perf_counter()

    def on_hang(report):
        print(json.dumps(report.diagnosis.to_dict()), flush=True)
        os._exit(0)

    Watchdog(lambda: progress["t"], 1.0, on_hang, poll_s=0.05).start()
    workers = [threading.Thread(target=take_ab, name="worker-ab"), threading.Thread(target=take_ba, name="worker-ba")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print("no deadlock", flush=True)
''')


@pytest.mark.timeout(60)
def test_a_real_lock_order_deadlock_in_a_child_is_reported_as_a_lock_cycle_in_time(tmp_path):
    script = tmp_path / "deadlock_child.py"  # a file, so the classifier can read the source lines
    script.write_text(DEADLOCK_CHILD)
    began = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    elapsed = time.monotonic() - began
    diagnosis = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (diagnosis["kind"], diagnosis["cycle"]) == ("deadlock", HangCycle.LOCK_CYCLE)
    assert set(diagnosis["threads"]) == {"worker-ab", "worker-ba"}
    assert any(step.startswith("worker-ab holds lock_a and waits for lock_b") for step in diagnosis["chain"])
    assert any(step.startswith("worker-ba holds lock_b and waits for lock_a") for step in diagnosis["chain"])
    assert elapsed < 20


def _dynamo_cycle_stacks():
    """The compile-lock / autograd cycle as the stacks show it (file and function names as torch writes them)."""
    from dflash_doctor.runtime.stacks import Frame, ThreadStack

    holder = ThreadStack("drafter-1", 1, (
        Frame("/site/torch/_dynamo/convert_frame.py", 900, "_compile", "return _compile_inner(code)"),
        Frame("/site/torch/_functorch/_aot_autograd/graph_compile.py", 300, "aot_stage1_graph_capture", "fw()"),
        Frame("/site/torch/autograd/__init__.py", 400, "grad", "result = _engine_run_backward(")))
    device_thread = ThreadStack("thread-77", 2, (
        Frame("/site/torch/_functorch/_aot_autograd/runtime_wrappers.py", 2850, "_backward_impl", "bw_compiler()"),
        Frame("/site/torch/_inductor/compile_fx.py", 2575, "compile_fx_backward", "with compile_lock:")))
    return [holder, device_thread]


def test_a_compile_lock_cycle_seen_in_two_quiet_samples_fires_long_before_the_silence_rule():
    clock, fired, samples = FakeClock(), [], []
    last = {"t": 100.0}

    def capture():
        samples.append(clock.now)
        return _dynamo_cycle_stacks()

    dog = Watchdog(lambda: last["t"], 60.0, fired.append, clock=clock, capture=capture, cpu_seconds=None,
                   cycle_confirm_s=1.5)
    clock.now = 101.0
    assert dog.check() is None and samples == []  # not quiet long enough to look
    clock.now = 101.5
    assert dog.check() is None and samples == [101.5]  # first sample: a suspect, not yet a verdict
    clock.now = 102.0
    assert dog.check() is None and samples == [101.5]  # samples are cycle_confirm_s apart
    clock.now = 103.0
    report = dog.check()
    assert report is not None and report.diagnosis.cycle == HangCycle.COMPILE_LOCK_AUTOGRAD and fired == [report]
    assert report.diagnosis.stalled_s == pytest.approx(3.0)


def test_progress_between_samples_clears_a_suspected_cycle():
    clock, fired = FakeClock(), []
    last = {"t": 100.0}
    dog = Watchdog(lambda: last["t"], 60.0, fired.append, clock=clock, capture=_dynamo_cycle_stacks,
                   cpu_seconds=None, cycle_confirm_s=1.5)
    clock.now = 101.5
    assert dog.check() is None  # suspect
    last["t"] = 102.0  # an event: the threads moved (a compile on another device finished its joint trace)
    clock.now = 103.0
    assert dog.check() is None
    clock.now = 103.6
    assert dog.check() is None  # a fresh suspect, sampled after the event
    clock.now = 105.1
    assert dog.check() is not None and len(fired) == 1


def test_stacks_without_a_cycle_wait_for_the_silence_rule():
    clock, fired = FakeClock(), []
    dog = Watchdog(lambda: 100.0, 10.0, fired.append, clock=clock, capture=lambda: [], cpu_seconds=None,
                   cycle_confirm_s=1.5)
    for now in (101.5, 103.0, 104.5, 106.0, 109.9):
        clock.now = now
        assert dog.check() is None
    clock.now = 110.0
    assert dog.check() is not None

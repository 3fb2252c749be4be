"""The watchdog options `run`'s agent uses: the fallback gate, the cheap pre-check before a cycle sample (on real
threads), the times a report's latency is read from, and the CPU reading that rescans descendants rarely."""
from __future__ import annotations

import subprocess
import sys
import threading

from dflash_doctor.runtime.deadlock import may_hold_a_cycle
from dflash_doctor.runtime.watchdog import ProcessTreeCpu, Watchdog
from tests.runtime.test_watchdog import FakeClock


def test_the_fallback_waits_until_it_is_armed():
    clock, fired, armed = FakeClock(), [], {"on": False}
    dog = Watchdog(lambda: 100.0, 5.0, fired.append, clock=clock, capture=lambda: [], cpu_seconds=None,
                   cycle_confirm_s=None, fallback_armed=lambda: armed["on"])
    clock.now = 200.0
    assert dog.check() is None and fired == []  # an idle launcher: no compile yet, no hang
    armed["on"] = True
    assert dog.check() is not None and dog.fired_at == 200.0


def test_a_precheck_that_sees_no_cycle_skips_the_capture_and_counts_as_a_clear_sample():
    clock, captured = FakeClock(), []
    dog = Watchdog(lambda: 100.0, 60.0, lambda report: None, clock=clock, cpu_seconds=None,
                   capture=lambda: captured.append(clock.now) or [], precheck=lambda: False)
    clock.now = 102.0
    assert dog.check() is None
    assert captured == [] and dog.last_clear_sample_at == 102.0


def test_may_hold_a_cycle_sees_a_thread_blocked_on_a_lock_and_not_one_waiting_on_an_event():
    lock, event, started = threading.Lock(), threading.Event(), threading.Barrier(3)

    def blocked_on_the_lock():
        started.wait()
        with lock:
            pass

    def waiting_on_the_event():
        started.wait()
        event.wait(30)

    lock.acquire()
    threads = [threading.Thread(target=blocked_on_the_lock), threading.Thread(target=waiting_on_the_event)]
    for thread in threads:
        thread.start()
    started.wait()
    try:
        frames = sys._current_frames()
        deadline = threading.Event()
        while not deadline.wait(0.05):  # until the first thread is inside its `with`
            frames = sys._current_frames()
            if may_hold_a_cycle([frames[threads[0].ident]]):
                break
        assert may_hold_a_cycle([frames[threads[0].ident]])
        assert not may_hold_a_cycle([frames[threads[1].ident]])
    finally:
        lock.release()
        event.set()
        for thread in threads:
            thread.join(30)


def test_process_tree_cpu_counts_a_busy_child_found_at_a_rescan():
    clock = FakeClock()
    cpu = ProcessTreeCpu(rescan_s=10.0, clock=clock)
    before = cpu()
    child = subprocess.Popen([sys.executable, "-c", "import time\nend = time.process_time() + 1.0\n"
                              "while time.process_time() < end: pass\ntime.sleep(30)"])
    try:
        assert cpu() - before < 0.5  # not rescanned yet: the new child is not counted
        clock.now += 10.0
        total = before
        for _ in range(600):  # the child burns one CPU second, then sleeps
            total = cpu()
            if total - before >= 0.9:
                break
            threading.Event().wait(0.05)
        assert total - before >= 0.9
    finally:
        child.kill()
        child.wait(30)

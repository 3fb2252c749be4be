"""A watchdog: a lock cycle in the stacks, or no progress for `hang_after` seconds -> classify the hang, report.

Two rules. The fast one: once no event came for `cycle_confirm_s`, it samples every thread's stack each
`cycle_confirm_s`; the same lock cycle (the compile-lock / autograd one, or threads waiting on each other's lock
objects: runtime/lock_sites.py) in two samples with no event between them is a deadlock, reported at once instead of after `hang_after` seconds
of silence. The fallback, for hangs whose stacks show no cycle: no progress for `hang_after` seconds.

Progress is an event (a step, an FX trace, a compile) or the process tree burning CPU: an inductor compile can go
many seconds without an event, but it keeps a core busy, while deadlocked threads use none.

In-process it uses `sys._current_frames()` from its own thread, which works while the stuck threads wait on
locks (they release the GIL). If a thread holds the GIL forever the watchdog cannot run; `arm_faulthandler`
sets up faulthandler's C-level dump as the fallback, which the repro harness reads after killing the child.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, List, Optional

from dflash_doctor.runtime.deadlock import HangDiagnosis, classify_hang
from dflash_doctor.runtime.stacks import ThreadStack, capture_stacks


BUSY_CORE_FRACTION = 0.1  # above this share of one core, averaged over a window, the tree counts as working
BUSY_WINDOW_S = 1.0


def process_tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process, its reaped children and its live descendants (compile workers,
    the C++ compiler)."""
    import psutil

    me = psutil.Process()
    times = me.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in me.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.Error:  # it ended between listing and reading
            continue
        total += child_times.user + child_times.system
    return total


class ProcessTreeCpu:
    """`process_tree_cpu_seconds` for a watchdog that asks every second inside a user's training process: this
    process through os.times() (a syscall), live descendants from a list rescanned every `rescan_s` (listing them
    walks all of /proc, several ms on a loaded machine; docs/run.md "Overhead")."""

    def __init__(self, rescan_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._rescan_s = rescan_s
        self._clock = clock
        self._children: list = []
        self._scanned_at = float("-inf")

    def __call__(self) -> float:
        import os

        import psutil

        own = os.times()
        total = own.user + own.system + own.children_user + own.children_system
        now = self._clock()
        if now - self._scanned_at >= self._rescan_s:
            self._scanned_at = now
            try:
                self._children = psutil.Process().children(recursive=True)
            except psutil.Error:
                self._children = []
        for child in self._children:
            try:
                child_times = child.cpu_times()
            except psutil.Error:  # it ended since the last scan
                continue
            total += child_times.user + child_times.system
        return total


@dataclass(frozen=True)
class HangReport:
    diagnosis: HangDiagnosis
    stacks: List[ThreadStack]


class Watchdog:
    """Polls `last_progress()` (a value of `clock`); fires `on_hang(HangReport)` once when neither an event nor
    CPU use (`cpu_seconds()`, cumulative; None to ignore CPU) showed progress for `hang_after_s`.

    Typical use: `Watchdog(lambda: recorder.last_progress, 60, on_hang).start()`.
    """

    def __init__(
        self,
        last_progress: Callable[[], float],
        hang_after_s: float,
        on_hang: Callable[[HangReport], None],
        *,
        clock: Callable[[], float] = time.perf_counter,
        poll_s: float = 0.2,
        capture: Callable[[], List[ThreadStack]] = lambda: capture_stacks(read_locks=True),
        cpu_seconds: Optional[Callable[[], float]] = process_tree_cpu_seconds,
        thread_factory=threading.Thread,
        cycle_confirm_s: Optional[float] = 1.5,
        fallback_armed: Callable[[], bool] = lambda: True,
        precheck: Optional[Callable[[], bool]] = None,
    ) -> None:
        self._last_progress = last_progress
        self._hang_after = hang_after_s
        self._on_hang = on_hang
        self._clock = clock
        self._poll = poll_s
        self._capture = capture
        self._cpu_seconds = cpu_seconds
        self._window = (clock(), cpu_seconds()) if cpu_seconds else None
        self._last_busy = float("-inf")
        self._cycle_confirm = cycle_confirm_s
        self._suspect: Optional[HangReport] = None  # a cycle seen in the last sample, waiting for confirmation
        self._suspect_at = float("-inf")
        # The "no progress" fallback fires only while this says so (run arms it once a compile began: an idle
        # launcher or helper process is not a hang); the cycle rule always runs.
        self._fallback_armed = fallback_armed
        # A cheap test before each cycle sample (deadlock.may_hold_a_cycle): False counts as a sample without a
        # cycle, so a quiet but healthy process is not parsed every `cycle_confirm_s`.
        self._precheck = precheck
        # When a stack sample last showed no cycle, and when the watchdog fired (values of `clock`): their
        # difference bounds how long a cycle went unreported.
        self.last_clear_sample_at: Optional[float] = None
        self.fired_at: Optional[float] = None
        self._stop = threading.Event()
        self._thread = thread_factory(target=self._run, name="dflash-doctor-watchdog", daemon=True)
        self.fired: Optional[HangReport] = None

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def last_alive(self) -> float:
        """When progress was last seen: an event, or a window in which the process tree used CPU."""
        return max(self._last_progress(), self._last_busy)

    def check(self) -> Optional[HangReport]:
        """One poll: fire if progress is stale. Public so tests can step it with a fake clock."""
        if self.fired is not None:
            return None
        now = self._clock()
        self._note_cpu(now)
        report = self._confirmed_cycle(now)
        stalled = now - self.last_alive()
        if report is None and stalled >= self._hang_after and self._fallback_armed():
            stacks = self._capture()
            report = HangReport(classify_hang(stacks, stalled), stacks)
        if report is None:
            return None
        self.fired = report
        self.fired_at = now
        self._on_hang(report)
        return report

    def _confirmed_cycle(self, now: float) -> Optional[HangReport]:
        """The fast rule: the same cycle in two stack samples `cycle_confirm_s` apart, no event in between."""
        if self._cycle_confirm is None:
            return None
        quiet = now - self._last_progress()
        if quiet < self._cycle_confirm:
            self._suspect = None
            return None
        if now - self._suspect_at < self._cycle_confirm:
            return None
        if self._precheck is not None and not self._precheck():
            self._suspect, self._suspect_at, self.last_clear_sample_at = None, now, now
            return None
        stacks = self._capture()
        diagnosis = classify_hang(stacks, quiet)
        previous, previous_at = self._suspect, self._suspect_at
        # only a true wait-for cycle never resolves, so only it can be settled by a second sample
        suspect = HangReport(diagnosis, stacks) if diagnosis.cycle.is_wait_for_cycle else None
        self._suspect, self._suspect_at = suspect, now
        if self._suspect is None:
            self.last_clear_sample_at = now
        # The same cycle means the same threads waiting on the same lock objects, not only the same kind: two
        # samples of a busy program can each catch a different, passing contention.
        if (self._suspect is not None and previous is not None
                and previous.diagnosis.signature == diagnosis.signature and self._last_progress() < previous_at):
            return self._suspect
        return None

    def _note_cpu(self, now: float) -> None:
        """Close a CPU window every BUSY_WINDOW_S; a busy window counts as progress at its end."""
        if self._window is None or self._cpu_seconds is None:
            return
        started, cpu_at_start = self._window
        if now - started < BUSY_WINDOW_S:
            return
        cpu = self._cpu_seconds()
        if cpu - cpu_at_start >= BUSY_CORE_FRACTION * (now - started):
            self._last_busy = now
        self._window = (now, cpu)

    def _run(self) -> None:
        while not self._stop.wait(self._poll):
            if self.check() is not None:
                return


def arm_faulthandler(path, after_s: float):
    """Dump all thread stacks to `path` after `after_s` seconds unless disarmed; returns the open file
    (keep it open while armed). Disarm with `faulthandler.cancel_dump_traceback_later()`."""
    import faulthandler

    handle = open(path, "w", encoding="utf-8")
    faulthandler.dump_traceback_later(after_s, repeat=False, file=handle, exit=False)
    return handle

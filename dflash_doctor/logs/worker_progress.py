"""Per-worker progress: throughput series with a rolling baseline (DFD503), their total, and stalls (DFD507).

A series is one worker's rate in one unit (tok/s, samples/s, it/s), or the total of all named workers in that
unit. The total matters because a dead worker's series just stops: the survivors look healthy while the pipeline
lost a third of its throughput. Short logs get a second test at the end: a series that ends on two or more low
samples after at least three normal ones is a drop even when there were too few samples for the rolling window.

Everything is bounded: a deque of `window` samples per series, the first HISTORY samples for the end test, and at
most `max_threads` workers (later new names are counted, not tracked).
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List, Optional, Tuple

TOTAL = "total"  # the name of the series summing all named workers
HISTORY = 64  # samples kept per series for the end-of-log test; longer series are the rolling test's job


@dataclass(frozen=True)
class DropEvent:
    thread: str  # a worker, or TOTAL
    baseline: float  # rate before
    level: float  # median rate of the dropped samples
    from_line: int  # first line of the drop
    line: int  # the line at which the drop became sustained (the last sample, for the end-of-log test)
    unit: str = "tok/s"
    at_end: bool = False  # found by the end-of-log test (too few samples for the rolling window)


@dataclass(frozen=True)
class StallEvent:
    thread: str
    last_step: int
    line: int  # the thread's last progress line
    peer: str
    peer_advanced: int


@dataclass
class Series:
    baseline: Deque[float]
    low: List[Tuple[float, int]] = field(default_factory=list)
    history: List[Tuple[float, int]] = field(default_factory=list)
    samples: int = 0
    fired: bool = False


@dataclass
class ThreadProgress:
    first_line: int
    last_line: int = 0
    last_step: Optional[int] = None
    last_step_line: Optional[int] = None
    last_rate: Optional[float] = None
    rate_unit: Optional[str] = None
    progress_lines: int = 0
    increments: Deque[int] = field(default_factory=lambda: deque(maxlen=5))
    peers_at_last_step: Dict[str, int] = field(default_factory=dict)

    def typical_increment(self) -> int:
        return int(statistics.median(self.increments)) if self.increments else 1


@dataclass
class _Round:
    """The named workers that reported since the last total sample, with their latest rate."""

    rates: Dict[str, float] = field(default_factory=dict)
    first_line: int = 0


class ProgressTracker:
    def __init__(self, window: int = 10, sustain: int = 5, drop: float = 0.3, stall_steps: int = 20,
                 max_threads: int = 1024, unnamed: str = "main") -> None:
        if window < 1 or sustain < 1 or not 0 < drop < 1 or stall_steps < 1:
            raise ValueError("window, sustain and stall_steps must be >= 1 and drop in (0, 1)")
        self.window, self.sustain, self.drop, self.stall_steps = window, sustain, drop, stall_steps
        self.max_threads = max_threads
        self.unnamed = unnamed
        self.threads: Dict[str, ThreadProgress] = {}
        self._series: Dict[Tuple[str, str], Series] = {}
        self._rounds: Dict[str, _Round] = {}
        self._steps: Dict[str, int] = {}  # every tracked thread's last step, copied (in C) at each step change
        self.untracked_threads = 0

    def _thread(self, name: str, line: int) -> Optional[ThreadProgress]:
        state = self.threads.get(name)
        if state is None:
            if len(self.threads) >= self.max_threads:
                self.untracked_threads += 1
                return None
            state = self.threads[name] = ThreadProgress(first_line=line)
        return state

    def record(self, thread: str, step: Optional[int], rate: Optional[float], line: int,
               unit: str = "tok/s") -> List[DropEvent]:
        """One progress line: its step and/or throughput. Returns the drops it completes (a worker's and the
        total's)."""
        if step is not None:
            self.step(thread, step, line)
        return [] if rate is None else self.throughput(thread, rate, line, unit)

    def step(self, thread: str, step: int, line: int) -> None:
        state = self.threads.get(thread) or self._thread(thread, line)
        if state is None:
            return
        if state.last_step is not None and step > state.last_step:
            state.increments.append(step - state.last_step)
        if state.last_step is None or step != state.last_step:
            state.peers_at_last_step = self._steps.copy()  # includes itself; stalls() skips it
        state.last_step, state.last_step_line = step, line
        self._steps[thread] = step
        state.last_line = line

    def throughput(self, thread: str, rate: float, line: int, unit: str = "tok/s") -> List[DropEvent]:
        state = self.threads.get(thread) or self._thread(thread, line)
        if state is None:
            return []
        state.last_rate, state.rate_unit, state.last_line = rate, unit, line
        state.progress_lines += 1
        events = []
        own = self._sample((thread, unit), rate, line)
        if own is not None:
            events.append(own)
        if thread != self.unnamed:
            total = self._round(thread, rate, line, unit)
            if total is not None:
                events.append(total)
        return events

    def _round(self, thread: str, rate: float, line: int, unit: str) -> Optional[DropEvent]:
        # A round closes when a worker reports a second time, so a dead or stalled worker simply stops being part
        # of the rounds after its last report, and its share leaves the total.
        if (self.unnamed, unit) in self._series:
            return None  # the log prints its own total in this unit: that series is watched instead
        current = self._rounds.setdefault(unit, _Round(first_line=line))
        event = None
        if thread in current.rates:  # everyone still alive has reported: one total sample
            if len(current.rates) >= 2 or (TOTAL, unit) in self._series:
                event = self._sample((TOTAL, unit), sum(current.rates.values()), current.first_line)
            current.rates, current.first_line = {}, line
        current.rates[thread] = rate
        return event

    def _sample(self, key: Tuple[str, str], value: float, line: int) -> Optional[DropEvent]:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = Series(baseline=deque(maxlen=self.window))
        series.samples += 1
        if len(series.history) < HISTORY:
            series.history.append((value, line))
        if len(series.baseline) < self.window:
            series.baseline.append(value)
            return None
        # The median is at most the window's maximum, so a sample at or above (1 - drop) x max cannot be low:
        # most lines are decided without sorting the window.
        if not series.low and value >= (1.0 - self.drop) * max(series.baseline):
            series.baseline.append(value)
            return None
        base = _median(series.baseline)
        if value < (1.0 - self.drop) * base:
            series.low.append((value, line))
            if len(series.low) < self.sustain:
                return None
            event = DropEvent(key[0], base, _median([v for v, _ in series.low]), series.low[0][1], line, key[1])
            # The new level becomes the baseline: a further drop from it is a new episode.
            series.baseline.clear()
            series.baseline.extend(v for v, _ in series.low)
            series.low.clear()
            series.fired = True
            return event
        series.baseline.extend(v for v, _ in series.low)  # a short dip was noise; the median absorbs it
        series.low.clear()
        series.baseline.append(value)
        return None

    def drops_at_end(self) -> List[DropEvent]:
        """Series too short for the rolling test that end on a lower level: at least three samples, then two or
        more, all below (1 - drop) x the median before them, running to the end of the log."""
        events = []
        for (name, unit), series in self._series.items():
            if series.fired or series.samples > len(series.history) or (
                    name == TOTAL and (self.unnamed, unit) in self._series):
                continue
            values = [v for v, _ in series.history]
            for start in range(3, len(values) - 1):
                base = _median(values[:start])
                tail = values[start:]
                if all(v < (1.0 - self.drop) * base for v in tail):
                    events.append(DropEvent(name, base, _median(tail), series.history[start][1],
                                            series.history[-1][1], unit, at_end=True))
                    break
        return events

    def stalls(self, exclude=()) -> List[StallEvent]:
        events = []
        for name, state in self.threads.items():
            if name in exclude or state.last_step is None:
                continue
            needed = max(self.stall_steps, 3 * state.typical_increment())
            best = None
            for peer, before in state.peers_at_last_step.items():
                now = self.threads[peer].last_step
                if peer == name or now is None:
                    continue
                advanced = now - before
                if advanced >= needed and (best is None or advanced > best[1]):
                    best = (peer, advanced)
            if best:
                events.append(StallEvent(name, state.last_step, state.last_step_line or state.last_line, best[0],
                                         best[1]))
        return events


def _median(values) -> float:
    # statistics.median is several times slower, and this runs on every throughput sample
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

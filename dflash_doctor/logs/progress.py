"""Per-thread progress: throughput series with a rolling baseline (DFD503) and step progress (DFD507).

Everything is bounded: a deque of `window` samples and a few numbers per thread, and at most `max_threads`
threads (later new names are counted, not tracked).
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass(frozen=True)
class DropEvent:
    thread: str
    baseline: float  # tok/s before
    level: float  # median tok/s of the dropped samples
    from_line: int  # first line of the drop
    line: int  # the line at which the drop became sustained


@dataclass(frozen=True)
class StallEvent:
    thread: str
    last_step: int
    line: int  # the thread's last progress line
    peer: str
    peer_advanced: int


@dataclass
class ThreadProgress:
    first_line: int
    last_line: int = 0
    last_step: Optional[int] = None
    last_step_line: Optional[int] = None
    last_tok_s: Optional[float] = None
    progress_lines: int = 0
    baseline: deque = None
    low: List[tuple] = field(default_factory=list)
    increments: deque = field(default_factory=lambda: deque(maxlen=5))
    peers_at_last_step: Dict[str, int] = field(default_factory=dict)

    def typical_increment(self) -> int:
        return int(statistics.median(self.increments)) if self.increments else 1


class ProgressTracker:
    def __init__(self, window: int = 10, sustain: int = 5, drop: float = 0.3, stall_steps: int = 20,
                 max_threads: int = 1024) -> None:
        if window < 1 or sustain < 1 or not 0 < drop < 1 or stall_steps < 1:
            raise ValueError("window, sustain and stall_steps must be >= 1 and drop in (0, 1)")
        self.window, self.sustain, self.drop, self.stall_steps = window, sustain, drop, stall_steps
        self.max_threads = max_threads
        self.threads: Dict[str, ThreadProgress] = {}
        self._steps: Dict[str, int] = {}  # every tracked thread's last step, copied (in C) at each step change
        self.untracked_threads = 0

    def _thread(self, name: str, line: int) -> Optional[ThreadProgress]:
        state = self.threads.get(name)
        if state is None:
            if len(self.threads) >= self.max_threads:
                self.untracked_threads += 1
                return None
            state = self.threads[name] = ThreadProgress(first_line=line, baseline=deque(maxlen=self.window))
        return state

    def record(self, thread: str, step: Optional[int], tok_s: Optional[float], line: int) -> Optional[DropEvent]:
        """One progress line: its step and/or throughput."""
        if step is not None:
            self.step(thread, step, line)
        return None if tok_s is None else self.throughput(thread, tok_s, line)

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

    def throughput(self, thread: str, tok_s: float, line: int) -> Optional[DropEvent]:
        state = self.threads.get(thread) or self._thread(thread, line)
        if state is None:
            return None
        state.last_tok_s, state.last_line = tok_s, line
        state.progress_lines += 1
        if len(state.baseline) < self.window:
            state.baseline.append(tok_s)
            return None
        # The median is at most the window's maximum, so a sample at or above (1 - drop) x max cannot be low:
        # most lines are decided without sorting the window.
        if tok_s >= (1.0 - self.drop) * max(state.baseline) and not state.low:
            state.baseline.append(tok_s)
            return None
        base = _median(state.baseline)
        if tok_s < (1.0 - self.drop) * base:
            state.low.append((tok_s, line))
            if len(state.low) < self.sustain:
                return None
            event = DropEvent(thread, base, _median([v for v, _ in state.low]), state.low[0][1], line)
            # The new level becomes the baseline: a further drop from it is a new episode.
            state.baseline.clear()
            state.baseline.extend(v for v, _ in state.low)
            state.low.clear()
            return event
        state.baseline.extend(v for v, _ in state.low)  # a short dip was noise; the median absorbs it
        state.low.clear()
        state.baseline.append(tok_s)
        return None

    def stalls(self, exclude=()) -> List[StallEvent]:
        events = []
        for name, state in self.threads.items():
            if name in exclude or state.last_step is None:
                continue
            needed = max(self.stall_steps, 3 * state.typical_increment())
            best = None
            for peer, before in state.peers_at_last_step.items():
                if peer == name:
                    continue
                advanced = self.threads[peer].last_step - before
                if advanced >= needed and (best is None or advanced > best[1]):
                    best = (peer, advanced)
            if best:
                events.append(StallEvent(name, state.last_step, state.last_step_line, best[0], best[1]))
        return events


def _median(values) -> float:
    # statistics.median is several times slower, and this runs on every throughput line of the log
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

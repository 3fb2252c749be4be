"""Progress events: what a long-running analysis tells the command line while it works, without printing.

Domain code (the repro harness, the guards probes) is handed a `Reporter`, a callable taking one
`ProgressEvent`, and calls it as tasks start and end; the CLI decides how that is shown
(render/progress_view.py: a live display on a terminal, plain lines otherwise, nothing with -q).

Every event carries the one time it is given anywhere: `at_s`, seconds since the command's own run began, on
the clock the domain also writes into its facts. So a trial that reproduced at 25.7 s is "25.7 s" in the
progress line, in the verdict line and in the JSON (`time_to_verdict_s`), never three different numbers.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Callable, Optional


class EventKind(str, enum.Enum):
    STARTED = "started"  # a task began; it shows as running (with its elapsed time) until FINISHED
    FINISHED = "finished"  # the task with that key ended; `text` is its outcome in words
    NOTE = "note"  # a one-off line: a note about what this machine cannot show, a plan


@dataclass(frozen=True)
class ProgressEvent:
    kind: EventKind
    key: str  # names the task between STARTED and FINISHED ("natural trial 2/3 (mitigation none)")
    text: str  # what is shown: the task for STARTED, its outcome for FINISHED, the line for NOTE
    at_s: float  # seconds since the run began, the same clock as the run's facts
    step: Optional[int] = None  # this task is the step-th of `total` in its phase (1-based), where known
    total: Optional[int] = None


Reporter = Callable[[ProgressEvent], None]


def shifted(reporter: Reporter, offset_s: float) -> Reporter:
    """`reporter` for a part that starts `offset_s` into a longer run (check's guards, then its repro): its
    events keep the longer run's clock."""
    if reporter is silent:
        return silent

    def report(event: ProgressEvent) -> None:
        reporter(replace(event, at_s=round(event.at_s + offset_s, 3)))

    return report


def silent(event: ProgressEvent) -> None:
    """The reporter for callers that want none (library use, tests of the result alone)."""
    return None

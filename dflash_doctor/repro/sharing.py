"""Who compiles first into the run's one shared compile cache (ReproSpec.shares_cache says which trials use it).

Until a child that shares the cache has finished a compile into it, one sharing trial runs at a time (the
opener): sharing trials started together would each compile the same graphs cold, and a sharing trial's outcome
does not depend on when it runs or how long its compiles take. Trials that compile cold go on meanwhile. Pure
bookkeeping: the harness asks before it starts a trial and tells it when a sharing child or trial ends.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from dflash_doctor.outcomes import RecorderEventKind
from dflash_doctor.repro import phase_record


class SharedCache:
    def __init__(self) -> None:
        self.filled = False  # a sharing child finished a compile into the cache
        self._opener: Optional[object] = None  # the sharing trial running before it was filled

    def may_start(self, sharing: bool) -> bool:
        """Whether a trial (`sharing` the cache or not) may start now."""
        return not sharing or self.filled or self._opener is None

    def started(self, trial: object, sharing: bool) -> None:
        if sharing and not self.filled and self._opener is None:
            self._opener = trial

    def ended(self, trial: object) -> None:
        """A trial ended or was stopped: filled or not, the next sharing trial may go."""
        if self._opener is trial:
            self._opener = None

    def child_ended(self, phase_dir: Path) -> None:
        """A child that shares the cache ended: if it finished a compile, the cache holds what it compiled."""
        if self.filled:
            return
        try:
            events = phase_record.read(phase_dir / "result.json").events
        except (OSError, phase_record.PhaseRecordError):  # no result (killed, crashed) or none it can read
            return  # it filled nothing that can be counted on
        self.filled = any(e.kind == RecorderEventKind.COMPILE and e.phase == "E" for e in events)

"""Where a scan is in the log: the line being parsed, the block it was cut from, and what lies before it there.

Large blocks are read through the prefilter and a progress sample (intake.py), so the scanner skips lines. 'The line
before this one' and 'this worker's last step before it' are therefore read back from the block the line came from,
never from what the scanner happened to parse last; only lines fed one at a time (`feed`, no block) fall back to
the previous line parsed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

from dflash_doctor.logs.lines import WorkerNames
from dflash_doctor.logs.throughput import TOK_S, rate, step
from dflash_doctor.logs.worker_progress import ProgressTracker
from dflash_doctor.rules.logs import UNNAMED

LOOKBACK_TRIES = 16  # lines holding a dead worker's name tried when looking back for its last step


class Where(NamedTuple):
    """The line being parsed as it lies in the block fed: the block, the line's offset in it, its number."""

    block: bytes
    offset: int
    lineno: int


@dataclass
class Cursor:
    """The scan's position; one per scan, shared by every part that reads or counts lines."""

    lines: int = 0  # the last line fed; while a line is parsed, its number (source.py numbers the next block from it)
    bytes: int = 0
    lineno: int = 0  # the line the dispatcher is parsing (or parsed last): where a span ends when the next line ends it
    where: Optional[Where] = None  # None for a line fed alone: nothing to read back from
    previous: Optional[str] = None  # the body of the last line parsed
    sampled: bool = False  # some progress lines were skipped (large blocks)

    def line_before(self) -> Optional[str]:
        """The line just before the one being parsed (read from the block: the scanner may have skipped it)."""
        if self.where is None:
            return self.previous
        block, offset, _ = self.where
        if offset == 0:
            return self.previous
        start = block.rfind(b"\n", 0, offset - 1) + 1
        return bytes(block[start:offset - 1]).decode("utf-8", "replace").rstrip("\r")


def look_back(cursor: Cursor, names: WorkerNames, progress: ProgressTracker, worker: str) -> None:
    """Where progress was sampled, find the worker's last progress line before the line being parsed (its
    traceback's first line, or the line saying it died) in this block, so its 'last step' is exact."""
    if cursor.where is None or worker == UNNAMED:
        return
    tag = names.tags.get(worker) or f"[{worker}]".encode("utf-8", "replace")
    block, offset, line = cursor.where
    state = progress.threads.get(worker)
    hit = block.rfind(tag, 0, offset)
    for _ in range(LOOKBACK_TRIES):
        if hit < 0:
            return
        start = block.rfind(b"\n", 0, hit) + 1
        end = block.find(b"\n", hit)
        hit_line = line - block.count(b"\n", start, offset)
        if state is not None and state.last_line >= hit_line:
            return
        text = block[start:end].decode("utf-8", "replace")
        found, steps = rate(text), step(text)
        if found is not None or steps is not None:
            value, unit = found if found is not None else (None, TOK_S)
            progress.record(worker, steps, value, hit_line, unit)
            return
        hit = block.rfind(tag, 0, start)

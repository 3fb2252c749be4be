"""Traceback blocks: `Exception in thread NAME:` / `Traceback ...` up to the exception line(s) that end them.

Works on full logs and on grep'd excerpts (the seeds' three lines have no 'Traceback' line). Lines from other
threads interleaved inside a block are handed back so the caller still sees them. Frames are kept in a bounded
deque, so a pathological block cannot grow memory.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from dflash_doctor.logs import patterns

MAX_FRAMES = 32
MAX_CHAINED = 4


@dataclass(frozen=True)
class ExceptionRecord:
    type: str
    message: str
    line: int


@dataclass(frozen=True)
class ExceptionBlock:
    thread: Optional[str]  # from 'Exception in thread NAME:'; None for a plain traceback
    start_line: int
    frames: Tuple[Tuple[str, int, str], ...]  # (file, line, function), innermost last
    exceptions: Tuple[ExceptionRecord, ...]  # chained ones first, the one that ended the block last

    @property
    def final(self) -> Optional[ExceptionRecord]:
        return self.exceptions[-1] if self.exceptions else None


@dataclass
class _Open:
    thread: Optional[str]
    start_line: int
    frames: deque = field(default_factory=lambda: deque(maxlen=MAX_FRAMES))
    exceptions: List[ExceptionRecord] = field(default_factory=list)
    ended: bool = False  # an exception line came; a chain marker or a new Traceback may still continue it

    def close(self) -> ExceptionBlock:
        return ExceptionBlock(self.thread, self.start_line, tuple(self.frames), tuple(self.exceptions))


class BlockParser:
    """feed(line, lineno) -> (closed blocks, whether the line was consumed by a block)."""

    def __init__(self) -> None:
        self._open: Optional[_Open] = None
        self._chained = False

    @property
    def active(self) -> bool:
        return self._open is not None

    def feed(self, text: str, lineno: int) -> Tuple[List[ExceptionBlock], bool]:
        if self._open is None and not (text.startswith("Exception in thread ") or "Traceback (most" in text):
            return [], False  # the common case, decided without a regex
        closed: List[ExceptionBlock] = []
        match = patterns.THREAD_EXCEPTION.match(text)
        if match:
            if self._open is not None:
                closed.append(self._open.close())
            self._open = _Open(match.group("thread"), lineno)
            self._chained = False
            return closed, True
        block = self._open
        if patterns.TRACEBACK_START.match(text):
            if block is None or (block.ended and not self._chained):
                if block is not None:
                    closed.append(block.close())
                self._open = _Open(None, lineno)
            else:
                block.ended = False  # the next section of a chained traceback
            self._chained = False
            return closed, True
        if block is None:
            return closed, False
        if not text.strip():
            return closed, True
        if patterns.CHAIN.match(text):
            self._chained = True
            return closed, True
        if text[0] in " \t":
            if block.ended and not self._chained:
                # a continuation of a multi-line exception message
                return closed, True
            frame = patterns.FRAME.match(text)
            if frame:
                block.frames.append((frame.group("file"), int(frame.group("line")), frame.group("func")))
            return closed, True
        exc = patterns.EXCEPTION_LINE.match(text)
        if exc and (not block.ended or self._chained):
            if len(block.exceptions) >= MAX_CHAINED:
                block.exceptions.pop(0)
            block.exceptions.append(ExceptionRecord(exc.group("type"), (exc.group("message") or "").strip(), lineno))
            block.ended = True
            self._chained = False
            return closed, True
        if block.ended:
            closed.append(block.close())
            self._open = None
        # An unrelated line (another thread's output interleaved, or the block's end): not consumed.
        return closed, False

    def flush(self, ended_only: bool = False) -> List[ExceptionBlock]:
        """Close what is open: everything at end of input; with `ended_only` (a follower caught up with the
        writer) only a block whose exception line has come, since a half-written traceback may still grow."""
        if self._open is None or (ended_only and not self._open.ended):
            return []
        block, self._open, self._chained = self._open.close(), None, False
        return [block]

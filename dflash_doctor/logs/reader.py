"""Line streams over files, pipes and growing files (`--follow`), bounded in memory whatever the input.

The scanner reads blocks: runs of whole lines, each ending in a newline, of about `chunk` bytes, so the hot loop
splits and matches a megabyte at a time in C instead of handling one Python object per line. A line longer than
`max_line` is cut there (the rest of it is skipped), so one runaway line (a progress bar without newlines) cannot
grow memory. `iter_lines` gives the same lines one by one, without their newline.
"""
from __future__ import annotations

import os
from typing import BinaryIO, Callable, Iterator, List, Optional

MAX_LINE = 64 * 1024
CHUNK = 1 << 20


class BlockSplitter:
    """Turns arbitrary reads into blocks of whole lines (each ending in b"\\n", none longer than `max_line`)."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._pending = b""  # the unfinished last line, at most max_line + one read long
        self._overflow = False  # inside a line already cut at max_line: drop bytes until its newline

    def push(self, data: bytes) -> List[bytes]:
        if self._overflow:
            end = data.find(b"\n")
            if end < 0:
                return []
            data, self._overflow = data[end + 1:], False
        end = data.rfind(b"\n")
        if end < 0:
            self._pending += data
            return self._cut_pending()
        block, self._pending = self._pending + data[:end + 1], data[end + 1:]
        return [_cut_long_lines(block, self.max_line)] + self._cut_pending()

    def end(self) -> List[bytes]:
        """The last line when the input does not end with a newline."""
        pending, self._pending = self._pending, b""
        return [pending + b"\n"] if pending and not self._overflow else []

    def reset(self) -> None:
        self._pending, self._overflow = b"", False

    def _cut_pending(self) -> List[bytes]:
        if len(self._pending) <= self.max_line:
            return []
        cut, self._pending, self._overflow = self._pending[:self.max_line] + b"\n", b"", True
        return [cut]


def _cut_long_lines(block: bytes, max_line: int) -> bytes:
    # Any run of max_line bytes without a newline holds a whole window of max_line // 2 starting at a multiple of
    # it, so a few C-level finds clear the usual block; only a block that may hold a long line is split and cut.
    window = max(1, max_line // 2)
    for start in range(0, len(block), window):
        if block.find(b"\n", start, start + window) < 0:
            return b"\n".join(line[:max_line] for line in block.split(b"\n"))
    return block


def iter_blocks(stream: BinaryIO, max_line: int = MAX_LINE, chunk: int = CHUNK) -> Iterator[bytes]:
    """Blocks of whole lines (see BlockSplitter) until EOF, reading `chunk` bytes at a time."""
    splitter = BlockSplitter(max_line)
    while True:
        data = stream.read(chunk)
        if not data:
            break
        yield from splitter.push(data)
    yield from splitter.end()


def iter_lines(stream: BinaryIO, max_line: int = MAX_LINE, chunk: int = CHUNK) -> Iterator[bytes]:
    """Every line of `stream` until EOF, without its newline."""
    for block in iter_blocks(stream, max_line, chunk):
        lines = block.split(b"\n")
        lines.pop()  # the empty string after the block's final newline
        yield from lines


def follow_blocks(
    path: str,
    should_stop: Callable[[], bool],
    on_idle: Optional[Callable[[], None]] = None,
    sleep: Callable[[float], None] = None,
    poll: float = 0.25,
    max_line: int = MAX_LINE,
) -> Iterator[Optional[bytes]]:
    """Like `tail -f` from the start of `path`: blocks of complete lines as they are written, until
    `should_stop()`.

    `on_idle` runs each time the reader has caught up (so callers can flush pending state); a file that shrinks
    (truncated or rotated by copy-truncate) is read again from its start, announced by yielding None.
    """
    import time

    sleep = sleep or time.sleep
    splitter = BlockSplitter(max_line)
    with open(path, "rb") as handle:
        while True:
            data = handle.read(CHUNK)
            if data:
                yield from splitter.push(data)
                continue
            if on_idle is not None:
                on_idle()
            if should_stop():
                break
            if os.stat(path).st_size < handle.tell():
                handle.seek(0)
                splitter.reset()
                yield None
            sleep(poll)
    yield from splitter.end()

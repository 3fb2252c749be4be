"""Line streams over files, pipes and growing files (`--follow`), bounded in memory whatever the input.

Lines come back as bytes without their newline; a line longer than `max_line` is cut there (the rest of it is
skipped), so one runaway line (a progress bar without newlines) cannot grow memory.
"""
from __future__ import annotations

import os
from typing import BinaryIO, Callable, Iterator, Optional

MAX_LINE = 64 * 1024
CHUNK = 1 << 20


def iter_lines(stream: BinaryIO, max_line: int = MAX_LINE, chunk: int = CHUNK) -> Iterator[bytes]:
    """Every line of `stream` until EOF, in chunks of `chunk` bytes."""
    pending = b""
    overflow = False  # inside a line already cut at max_line: drop bytes until its newline
    while True:
        block = stream.read(chunk)
        if not block:
            break
        parts = block.split(b"\n")
        parts[0] = pending + parts[0]
        pending = parts.pop()
        for line in parts:
            if overflow:
                overflow = False
                continue
            yield line[:max_line]
        if len(pending) > max_line:
            if not overflow:
                yield pending[:max_line]
            overflow = True
            pending = b""
    if pending and not overflow:
        yield pending[:max_line]


def follow_lines(
    path: str,
    should_stop: Callable[[], bool],
    on_idle: Optional[Callable[[], None]] = None,
    sleep: Callable[[float], None] = None,
    poll: float = 0.25,
    max_line: int = MAX_LINE,
) -> Iterator[Optional[bytes]]:
    """Like `tail -f` from the start of `path`: complete lines as they are written, until `should_stop()`.

    `on_idle` runs each time the reader has caught up (so callers can flush pending state); a file that shrinks
    (truncated or rotated by copy-truncate) is read again from its start, announced by yielding None.
    """
    import time

    sleep = sleep or time.sleep
    handle = open(path, "rb")
    try:
        pending = b""
        overflow = False
        while True:
            block = handle.read(CHUNK)
            if block:
                parts = block.split(b"\n")
                parts[0] = pending + parts[0]
                pending = parts.pop()
                for line in parts:
                    if overflow:
                        overflow = False
                        continue
                    yield line[:max_line]
                if len(pending) > max_line:
                    if not overflow:
                        yield pending[:max_line]
                    overflow, pending = True, b""
                continue
            if on_idle is not None:
                on_idle()
            if should_stop():
                break
            if os.stat(path).st_size < handle.tell():
                handle.seek(0)
                pending, overflow = b"", False
                yield None
            sleep(poll)
        if pending and not overflow:
            yield pending[:max_line]
    finally:
        handle.close()

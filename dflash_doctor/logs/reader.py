"""Line streams over files, pipes and growing files (`--follow`), bounded in memory whatever the input.

The scanner reads blocks: runs of whole lines, each ending in a newline, of about `chunk` bytes, so the hot loop
works on a megabyte at a time in C instead of one Python object per line. A line longer than `max_line` is cut
there (the rest of it is skipped), so one runaway line (a progress bar without newlines) cannot grow memory.

What is read: a regular file (gzip, bzip2 and xz are decompressed on the fly, recognised by their magic bytes,
not their name) or stdin. A FIFO, a device (/dev/zero), a socket or a folder is a Problem, never a hang: it could
block forever or never end. Binary data (NUL bytes where text should be) is a Problem too.
"""
from __future__ import annotations

import os
import stat
from typing import Any, BinaryIO, Callable, Iterator, List, Optional, Tuple, Union

from dflash_doctor.findings import Problem
from dflash_doctor.outputs import file_kind

MAX_LINE = 64 * 1024
CHUNK = 1 << 20
SAMPLE = 64 * 1024  # read first to tell text from binary data
_MAGIC = ((b"\x1f\x8b", "gzip"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))
_UNSUPPORTED_MAGIC = ((b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"))
_READ_ONLY_REGULAR = "only regular files and - (stdin) are read"


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


def _has_long_line(block, end: int, max_line: int) -> bool:
    # Any run of max_line bytes without a newline holds a whole window of max_line // 2 starting at a multiple of
    # it, so a few C-level finds clear the usual block; only a block that may hold a long line is split and cut.
    window = max(1, max_line // 2)
    return any(block.find(b"\n", start, min(start + window, end)) < 0 for start in range(0, end, window))


def _cut_long_lines(block: bytes, max_line: int) -> bytes:
    if not _has_long_line(block, len(block), max_line):
        return block
    return b"\n".join(line[:max_line] for line in block.split(b"\n"))


class _Peeked:
    """A binary stream whose first bytes were already read (to look for magic bytes): gives them back first."""

    def __init__(self, head: bytes, stream: Any) -> None:
        self._head, self._stream = head, stream

    def readinto(self, target) -> int:
        if not self._head:
            return self._stream.readinto(target)
        data = self.read(len(target))
        target[:len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        if self._head:
            head, self._head = self._head, b""
            if size < 0:
                return head + self._stream.read()
            if len(head) >= size:
                self._head = head[size:]
                return head[:size]
            return head + self._stream.read(size - len(head))
        return self._stream.read(size)

    def close(self) -> None:
        self._stream.close()

    @property
    def cut(self) -> Optional[str]:
        return cut_of(self._stream)


class _CarriageReturns:
    """A log whose lines end in CR alone (classic Mac OS, some serial consoles and exporters), read as LF lines.
    Decided on the first SAMPLE bytes: a log that ends its lines in LF keeps its CRs (a progress bar's redraws,
    CRLF endings), which the scanner reads as it always did."""

    def __init__(self, stream: _Peeked) -> None:
        self._stream = stream

    def readinto(self, target: Any) -> int:
        got = self._stream.readinto(target)
        target[:got] = bytes(target[:got]).replace(b"\r", b"\n")
        return got

    def read(self, size: int = -1) -> bytes:
        return self._stream.read(size).replace(b"\r", b"\n")

    def close(self) -> None:
        self._stream.close()

    @property
    def cut(self) -> Optional[str]:
        return cut_of(self._stream)


def _decompressing(head: bytes, stream: Any) -> Tuple[Any, Optional[str]]:
    for magic, name in _MAGIC:
        if head.startswith(magic):
            from dflash_doctor.logs.decompress import Decompressed

            return Decompressed(stream, name), name
    return stream, None


def compression_of(head: bytes) -> Optional[str]:
    """The compression whose magic bytes `head` starts with, read or not (gzip, bzip2, xz, zstd, zip)."""
    return next((name for magic, name in _MAGIC + _UNSUPPORTED_MAGIC if head.startswith(magic)), None)


def cut_of(stream: Any) -> Optional[str]:
    """Why a compressed stream from open_log ended before its end marker (decompress.Decompressed.cut), if it did."""
    return getattr(stream, "cut", None)


def open_log(path: str, stdin: Optional[BinaryIO] = None) -> Union[Tuple[BinaryIO, str, Optional[str]], Problem]:
    """(binary stream, display name, compression) for `path` (`-` is stdin), or the Problem that stops reading.
    A path that does not exist or cannot be opened is a UsageError (exit 2), as for every command.

    O_NONBLOCK keeps open() from waiting for a FIFO's writer should the path change between stat and open; the
    fstat of the open descriptor decides."""
    import sys

    from dflash_doctor.printable import printable_log

    if path == "-":
        raw: BinaryIO = stdin if stdin is not None else sys.stdin.buffer
        name = "<stdin>"
    else:
        name = printable_log(path)
        try:
            mode = os.stat(path).st_mode  # a socket cannot even be opened: name it before trying
            if not stat.S_ISREG(mode):
                return Problem(name, f"not read: {file_kind(mode)}", f"{_READ_ONLY_REGULAR}; pipe it: "
                               f"dflash-doctor logs - < {name}" if stat.S_ISFIFO(mode) else _READ_ONLY_REGULAR)
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        except OSError as exc:
            from dflash_doctor.errors import UsageError

            raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return Problem(name, "not read: it stopped being a regular file", _READ_ONLY_REGULAR)
        os.set_blocking(fd, True)
        raw = os.fdopen(fd, "rb")
    head = raw.read(8)
    for magic, kind in _UNSUPPORTED_MAGIC:
        if head.startswith(magic):
            _close(raw, path)
            return Problem(name, f"not read: {kind}-compressed", f"decompress it first and pipe it: "
                           f"{'zstdcat' if kind == 'zstd' else 'unzip -p'} {name} | dflash-doctor logs -")
    stream, compression = _decompressing(head, _Peeked(head, raw))
    try:
        sample = stream.read(SAMPLE)
    except OSError as exc:
        _close(stream, path)
        return Problem(name, f"not read: {exc}", "a damaged or truncated compressed file?")
    problem = binary_problem(name, sample)
    if problem is not None:
        _close(stream, path)
        return problem
    if b"\r" in sample and b"\n" not in sample:
        return _CarriageReturns(_Peeked(sample, stream)), name, compression  # type: ignore[return-value]
    return _Peeked(sample, stream), name, compression  # type: ignore[return-value]


def _close(stream, path: str) -> None:
    if path != "-":
        stream.close()


def binary_problem(name: str, block: bytes) -> Optional[Problem]:
    """Text logs hold (almost) no NUL bytes; a start that is a tenth NUL (a device, an image, a core dump) is not
    a log."""
    if block.count(b"\0") * 10 > len(block):
        return Problem(name, "not read: binary data (NUL bytes), not a text log",
                       "pass the log itself; compressed logs (gzip, bzip2, xz) are read as they are")
    return None


def iter_buffers(stream, max_line: int = MAX_LINE, chunk: int = CHUNK) -> Iterator[Tuple[bytes, int]]:
    """(buffer, end): buffer[:end] is whole lines, each ending in a newline and at most `max_line` long.

    The buffer is one bytearray reused for every read (readinto), valid until the next pair is asked for: a
    fresh megabyte object per read costs more in page faults than the scan itself."""
    buf = bytearray(chunk + max_line + 1)
    view = memoryview(buf)
    keep = 0  # bytes of an unfinished line at the front of buf
    skipping = False  # inside a line already cut at max_line: drop bytes until its newline
    while True:
        got = stream.readinto(view[keep:keep + chunk])
        if not got:
            break
        total = keep + got
        if skipping:
            newline = buf.find(b"\n", 0, total)
            if newline < 0:
                keep = 0
                continue
            skipping = False
            keep = total - newline - 1
            view[:keep] = bytes(view[newline + 1:total])
            continue
        end = buf.rfind(b"\n", 0, total) + 1
        if end == 0:
            if total > max_line:
                yield bytes(view[:max_line]) + b"\n", max_line + 1
                keep, skipping = 0, True
            else:
                keep = total
            continue
        if _has_long_line(buf, end, max_line):
            cut = _cut_long_lines(bytes(view[:end]), max_line)
            yield cut, len(cut)
        else:
            yield buf, end  # type: ignore[misc]
        keep = total - end
        view[:keep] = bytes(view[end:total])
    if keep and not skipping:
        yield bytes(view[:keep]) + b"\n", keep + 1


def iter_blocks(stream, max_line: int = MAX_LINE, chunk: int = CHUNK) -> Iterator[bytes]:
    """Blocks of whole lines as bytes objects of their own (see iter_buffers)."""
    for buffer, end in iter_buffers(stream, max_line, chunk):
        yield bytes(buffer[:end])


def iter_lines(stream, max_line: int = MAX_LINE, chunk: int = CHUNK) -> Iterator[bytes]:
    """Every line of `stream` until EOF, without its newline."""
    for block in iter_blocks(stream, max_line, chunk):
        lines = block.split(b"\n")
        lines.pop()  # the empty string after the block's final newline
        yield from lines


# What `follow_blocks` yields besides blocks: the file was replaced (rotated, deleted and re-created) or cut
# (truncated in place); line numbers restart with the new content.
REOPENED = "reopened"
TRUNCATED = "truncated"


def follow_blocks(
    path: str,
    should_stop: Callable[[], bool],
    on_idle: Optional[Callable[[], None]] = None,
    sleep: Optional[Callable[[float], None]] = None,
    poll: float = 0.25,
    max_line: int = MAX_LINE,
) -> Iterator[Union[bytes, str]]:
    """Like `tail -F` from the start of `path`: blocks of complete lines as they are written, until
    `should_stop()`.

    Nothing written is lost: before switching to a new file (rotation renames the old one away, or it is deleted
    and re-created) the old descriptor is read to its end, and a file truncated in place is read again from its
    start once what was buffered is used. A path that is missing for a while is waited for. `on_idle` runs each
    time the reader has caught up (so callers can flush pending state). REOPENED / TRUNCATED are yielded when the
    content starts over."""
    import time

    sleep = sleep or time.sleep
    splitter = BlockSplitter(max_line)
    handle: Optional[BinaryIO] = _open_regular(path)
    identity = _identity(handle)
    try:
        while True:
            data = handle.read(CHUNK) if handle is not None else b""
            if data:
                yield from splitter.push(data)
                continue
            # caught up with this descriptor: has the path moved on?
            current = _stat(path)
            if handle is not None and current is not None and _same(current, identity):
                if current.st_size < handle.tell():
                    yield from splitter.end()
                    handle.seek(0)
                    splitter.reset()
                    yield TRUNCATED
                    continue
            elif current is not None and stat.S_ISREG(current.st_mode):
                replacement = _open_regular(path)
                if replacement is not None:
                    if handle is not None:
                        yield from _drain(handle, splitter)
                        handle.close()
                    yield from splitter.end()
                    splitter.reset()
                    handle, identity = replacement, _identity(replacement)
                    yield REOPENED
                    continue
            if on_idle is not None:
                on_idle()
            if should_stop():
                break
            sleep(poll)
    finally:
        if handle is not None:
            handle.close()
    yield from splitter.end()


def _drain(handle: BinaryIO, splitter: BlockSplitter) -> Iterator[bytes]:
    while True:
        data = handle.read(CHUNK)
        if not data:
            return
        yield from splitter.push(data)


def _open_regular(path: str) -> Optional[BinaryIO]:
    try:
        handle = open(path, "rb")
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        return None
    return handle


def _identity(handle: Optional[BinaryIO]) -> Optional[Tuple[int, int]]:
    if handle is None:
        return None
    info = os.fstat(handle.fileno())
    return info.st_dev, info.st_ino


def _stat(path: str) -> Optional[os.stat_result]:
    try:
        return os.stat(path)
    except OSError:
        return None


def _same(info: os.stat_result, identity: Optional[Tuple[int, int]]) -> bool:
    return identity is not None and (info.st_dev, info.st_ino) == identity

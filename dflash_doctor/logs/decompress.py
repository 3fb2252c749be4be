"""Streaming decompression that keeps what it could read: gzip, bzip2 and xz, cut short or damaged.

Python's GzipFile, BZ2File and LZMAFile raise EOFError on a stream cut before its end marker and drop what the
failing read had already decompressed, and `logs` reads in 1 MiB blocks: a cut file lost up to a megabyte, or all
of it when the cut came before the first read's end. Here the decompressor objects are driven directly: every byte
they give is handed on, and a cut or damage is remembered as `cut` (where, in compressed bytes) for the reader to
report after the lines before it have been scanned. Concatenated members (`cat a.gz b.gz`) are read one after the
other, as zcat does.
"""
from __future__ import annotations

from typing import Any, BinaryIO, Callable, Optional

INPUT_CHUNK = 16 * 1024  # compressed bytes read at a time: the most that damage at their end can cost
MAX_OUT = 4 * 1024 * 1024  # decompressed bytes made at a time: a highly compressed input stays bounded


def _gzip() -> Any:
    import zlib

    return zlib.decompressobj(16 + zlib.MAX_WBITS)


def _bzip2() -> Any:
    import bz2

    return bz2.BZ2Decompressor()


def _xz() -> Any:
    import lzma

    return lzma.LZMADecompressor()


DECOMPRESSORS = {"gzip": _gzip, "bzip2": _bzip2, "xz": _xz}


def _errors() -> tuple:
    import lzma
    import zlib

    return (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError)


class Decompressed:
    """A binary stream of the decompressed bytes of `raw` (readinto / read / close), never raising for a cut or
    damaged input: it ends there and says so in `cut`."""

    def __init__(self, raw: BinaryIO, kind: str) -> None:
        self.kind = kind
        self._raw = raw
        self._new: Callable[[], Any] = DECOMPRESSORS[kind]
        self._decompressor = self._new()
        self._input = b""  # compressed bytes the decompressor has not taken yet (zlib's unconsumed tail)
        self._output_left = False  # the last call filled MAX_OUT: more output may come without more input
        self._pending = bytearray()  # decompressed, not handed on yet
        self._member_started = False
        self._read = 0  # compressed bytes read so far
        self._ended = False
        self.cut: Optional[str] = None  # why the data ended early, and where

    def readinto(self, target: Any) -> int:
        data = self.read(len(target))
        target[:len(data)] = data
        return len(data)

    def read(self, size: int = -1) -> bytes:
        while not self._ended and (size < 0 or len(self._pending) < size):
            self._step()
        if size < 0:
            size = len(self._pending)
        data = bytes(self._pending[:size])
        del self._pending[:size]
        return data

    def _wants_input(self) -> bool:
        if self._input:
            return False
        needs = getattr(self._decompressor, "needs_input", None)  # bz2 and lzma say so; zlib does not
        return needs if needs is not None else not self._output_left

    def _step(self) -> None:
        if self._wants_input():
            chunk = self._raw.read(INPUT_CHUNK)
            if not chunk:
                self._end()
                return
            self._read += len(chunk)
            self._input = chunk
            self._member_started = True
        decompressor = self._decompressor
        try:
            out = decompressor.decompress(self._input, MAX_OUT)
        except _errors() as exc:
            self._ended = True
            self.cut = f"the {self.kind} data is damaged within its first {self._read:,} compressed bytes: {exc}"
            return
        self._pending += out
        self._output_left = len(out) >= MAX_OUT
        self._input = getattr(decompressor, "unconsumed_tail", b"")
        if decompressor.eof:
            # the next member, if any (some writers pad between members with NUL bytes)
            self._input = (self._input + decompressor.unused_data).lstrip(b"\0")
            self._decompressor = self._new()
            self._output_left = False
            self._member_started = bool(self._input)

    def _end(self) -> None:
        self._ended = True
        flush = getattr(self._decompressor, "flush", None)
        if flush is not None:
            self._pending += flush()
        if self._member_started and not self._decompressor.eof:
            self.cut = (f"the {self.kind} data is cut short: it ends after {self._read:,} compressed bytes, before "
                        "its end marker")

    def close(self) -> None:
        self._raw.close()

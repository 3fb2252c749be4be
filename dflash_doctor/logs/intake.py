"""Line intake: which lines of what was read the scanner parses, and the progress lines it records on the way.

Large blocks are not read line by line. The prefilter (prefilter.py) finds the lines holding a rule's trigger
word; those are parsed, and once one opens something that spans lines (a traceback, torchrun's summary, a stack
dump, a recompile warning, a thread's one-line death) every following line is parsed until that is closed.
Throughput is sampled: the last SAMPLE_BYTES of every block are parsed in full, which gives each worker's series a
few samples per megabyte; blocks of up to DENSE_BYTES (small logs, a followed file's new lines) are parsed in full,
so small inputs give exactly what line-by-line parsing gives. (Where a worker dies, its last progress line before
the death is read back from the block: cursor.look_back.)
"""
from __future__ import annotations

import re
from typing import List, Optional, Protocol, Tuple

from dflash_doctor.findings import Finding
from dflash_doctor.logs import patterns
from dflash_doctor.logs.cursor import Where
from dflash_doctor.logs.prefilter import Prefilter
from dflash_doctor.logs.scan_context import ScanContext
from dflash_doctor.logs.throughput import TOK_S
from dflash_doctor.rules.logs import trigger_words

SAMPLE_BYTES = 8 * 1024  # parsed in full at the end of every large block (throughput samples)
DENSE_BYTES = 64 * 1024  # blocks up to this size are parsed in full
PROGRESS_ROWS = patterns.PROGRESS_ROWS.findall
PROGRESS_HINT = patterns.PROGRESS_HINT.search
UNIT_BYTES = patterns.UNIT_BYTES


def _trigger_regex() -> "re.Pattern[bytes]":
    words = sorted({w.encode() for w in trigger_words()}, key=len, reverse=True)
    return re.compile(b"|".join(re.escape(w) for w in words))


TRIGGER = _trigger_regex().search
_PREFILTER = Prefilter(trigger_words())


def may_matter(line: bytes) -> bool:
    """Whether an idle scanner must read a line it reads in full: a rule's word, progress, or a frame (it opens a
    traceback whose header was not pasted; the sampled path of large blocks does not look for those)."""
    return (bool(TRIGGER(line) or PROGRESS_HINT(line)) or b'File "' in line or line.startswith((b"(gdb) ", b"File "))
            or b"\xe2\x9d\xb1" in line)  # (rich's frame pointer)


class LineParser(Protocol):
    """The scanner's side of intake: whether something spans lines now, and the parsing of one line."""

    def busy(self) -> bool: ...

    def line(self, raw: bytes, lineno: int) -> List[Finding]: ...


class LineIntake:
    def __init__(self, context: ScanContext, parser: LineParser) -> None:
        self._cursor = context.cursor
        self._names = context.names
        self._progress = context.progress
        self._drops = context.drops
        self._default_threads = context.options.thread_pattern is None
        self._parser = parser

    def feed(self, raw: bytes, lineno: int) -> List[Finding]:
        """One line (without its newline): the findings it completes. Every line is parsed."""
        cursor = self._cursor
        cursor.lines = lineno
        cursor.bytes += len(raw) + 1
        cursor.where = None
        if not self._parser.busy() and not may_matter(raw):
            return []
        return self._parser.line(raw, lineno)

    def feed_block(self, block: bytes, lineno: int, end: Optional[int] = None) -> List[Finding]:
        """Whole lines, block[:end] (reader.iter_buffers), the first of them numbered `lineno`: the findings they
        complete. Small blocks are parsed in full; large ones through the prefilter and the progress sample."""
        end = len(block) if end is None else end
        cursor = self._cursor
        cursor.bytes += end
        if end <= DENSE_BYTES:
            new, line = self._dense(block, 0, end, lineno)
            cursor.lines = line - 1
            return new
        cursor.sampled = True
        window = block.rfind(b"\n", 0, end - SAMPLE_BYTES) + 1
        new, pos, line = self._prefiltered(block, window, lineno)
        if pos < window:
            line += block.count(b"\n", pos, window)
            pos = window
        found, line = self._dense(block, pos, end, line)
        cursor.lines = line - 1
        return new + found

    def _parse_at(self, block: bytes, start: int, line_end: int, line: int) -> List[Finding]:
        self._cursor.where = Where(block, start, line)
        self._cursor.lines = line
        return self._parser.line(bytes(block[start:line_end]), line)

    def _prefiltered(self, block: bytes, window: int, lineno: int) -> Tuple[List[Finding], int, int]:
        """The lines of block[:window] holding a trigger word, and every line while something spans lines:
        (findings, where it stopped, that line's number)."""
        starts = _PREFILTER.line_starts(block, window)
        new: List[Finding] = []
        pos, line, index = 0, lineno, 0
        while pos < window:
            if self._parser.busy():
                pos, line = self._until_idle(block, pos, window, line, new)
                continue
            while index < len(starts) and starts[index] < pos:
                index += 1
            if index == len(starts) or starts[index] >= window:
                break
            start = starts[index]
            line += block.count(b"\n", pos, start)
            line_end = block.find(b"\n", start)
            new += self._parse_at(block, start, line_end, line)
            pos, line = line_end + 1, line + 1
        return new, pos, line

    def _until_idle(self, block: bytes, pos: int, limit: int, line: int, new: List[Finding]) -> Tuple[int, int]:
        while pos < limit and self._parser.busy():
            line_end = block.find(b"\n", pos)
            new += self._parse_at(block, pos, line_end, line)
            pos, line = line_end + 1, line + 1
        return pos, line

    def _dense(self, block: bytes, start: int, end: int, lineno: int) -> Tuple[List[Finding], int]:
        """Every line of block[start:end]: the usual progress lines through one findall, the rest the general
        way when they can matter."""
        new: List[Finding] = []
        region = bytes(block[start:end]) if start or end != len(block) or not isinstance(block, bytes) else block
        decoded = self._names.decoded
        record = self._progress.record
        busy, parse = self._parser.busy, self._parser.line
        cursor = self._cursor
        offset = start
        if self._default_threads:
            rows = PROGRESS_ROWS(region)
        else:
            rows = [(line, b"", b"", b"", b"") for line in region.split(b"\n")[:-1]]
        idle = not busy()
        for line, thread, step_text, value, unit in rows:
            if thread and idle:
                name = decoded.get(thread) or self._names.decode(thread)
                drops = record(name, int(step_text), float(value) * UNIT_BYTES[unit], lineno, TOK_S)
                if drops:
                    new += self._drops(drops)
            elif not idle or may_matter(line):
                cursor.where = Where(block, offset, lineno)
                cursor.lines = lineno
                new += parse(line, lineno)
                idle = not busy()
            offset += len(line) + 1
            lineno += 1
        return new, lineno

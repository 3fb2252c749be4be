"""Reading one file for the scanner: byte prefilter, size cap, decoding and parsing, each failure a Problem.

Scanned code is never imported or executed: bytes are read, decoded per PEP 263 and handed to `ast.parse`.
"""
from __future__ import annotations

import ast
import functools
import io
import os
import stat
import tokenize
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Set, Tuple, Union

from dflash_doctor.findings import Problem
from dflash_doctor.outputs import file_kind
from dflash_doctor.rules.scan import SCAN_RULES, ByteTrigger

# Bigger than any hand-written module (torch's largest source, a generated test table, is 1.4 MB); parsing
# something larger costs memory for nothing a human will fix.
MAX_SOURCE_BYTES = 4 * 1024 * 1024
# Larger files are not even read for the byte prefilter: whatever they are, nobody wrote them by hand.
MAX_READ_BYTES = 64 * 1024 * 1024

_WINDOW = 400  # bytes around each trigger word that a pattern must match in (patterns are line-local)


@dataclass(frozen=True)
class _TriggerPlan:
    """What the prefilter searches for one set of enabled rules, worked out once per set: the prefilter runs on
    every file of a scan, and on a tree of small files its own bookkeeping cost as much as the searches."""

    codes: Tuple[Tuple[str, Tuple[int, ...]], ...]  # each enabled code with its triggers (indexes below), in order
    triggers: Tuple[ByteTrigger, ...]  # each once
    # the trigger words inside each word (itself included): a file that lacks one of them lacks the word too
    inner: Dict[bytes, Tuple[bytes, ...]]


@functools.lru_cache(maxsize=64)
def _trigger_plan(enabled: FrozenSet[str]) -> _TriggerPlan:
    every = {w for entry in SCAN_RULES.values() for trigger in entry.triggers for w in trigger.words}
    triggers: List[ByteTrigger] = []
    codes = []
    for code in sorted(enabled):  # DFD101's "checkpoint" is looked for before the words that contain it
        indexes = []
        for trigger in SCAN_RULES[code].triggers:
            if trigger not in triggers:
                triggers.append(trigger)
            indexes.append(triggers.index(trigger))
        codes.append((code, tuple(indexes)))
    inner = {word: tuple(w for w in every if w in word) or (word,)
             for trigger in triggers for word in trigger.words}
    return _TriggerPlan(tuple(codes), tuple(triggers), inner)


def _mentions(data: bytes, trigger: ByteTrigger, absent: Set[bytes], inner: Dict[bytes, Tuple[bytes, ...]]) -> bool:
    """Whether the trigger's pattern matches near an occurrence of one of its words (and its whole-file pattern
    anywhere): the windowed regex only ever sees small windows, so a 400 kB file costs a few substring searches,
    not a regex pass. Words found missing are added to `absent`."""
    for word in trigger.words:
        if any(contained in absent for contained in inner[word]):
            continue
        start = data.find(word)
        if start == -1:
            absent.add(word)
        while start != -1:
            if trigger.near.search(data, max(0, start - _WINDOW), start + _WINDOW):
                if trigger.anywhere_words and not any(other in data for other in trigger.anywhere_words):
                    return False
                return trigger.anywhere is None or trigger.anywhere.search(data) is not None
            start = data.find(word, start + _WINDOW)
    return False


def triggered(data: bytes, enabled: Iterable[str]) -> FrozenSet[str]:
    """The enabled rules that could fire on a file with these bytes (empty: the file need not be parsed). Each
    rule's byte triggers are declared with it (rules/scan.py); rules judged after the files are read have none."""
    plan = _trigger_plan(enabled if isinstance(enabled, frozenset) else frozenset(enabled))
    hits = []
    seen: Dict[int, bool] = {}  # trigger index -> whether it matched
    absent: Set[bytes] = set()  # words this file lacks: a word containing one cannot be there either
    for code, indexes in plan.codes:
        for index in indexes:
            found = seen.get(index)
            if found is None:
                found = seen[index] = _mentions(data, plan.triggers[index], absent, plan.inner)
            if found:
                hits.append(code)
                break
    return frozenset(hits)


@dataclass(frozen=True)
class ParsedSource:
    text: str
    tree: ast.Module


def read_bytes(path: str, max_read: int = MAX_READ_BYTES) -> Union[bytes, Problem]:
    """The bytes of a regular file, read whole; anything else (a FIFO, a device, a socket, a link to one of them,
    a file over `max_read`) is a Problem, never a hang or an unbounded read.

    O_NONBLOCK keeps open() from waiting for a FIFO's writer should the path change between walk and open;
    fstat on the open descriptor is what decides."""
    hint = "only regular files are scanned; exclude it with --exclude"
    try:
        mode = os.stat(path).st_mode  # a socket cannot even be opened: name it before trying
        if not stat.S_ISREG(mode):
            return Problem(path, f"not read: {file_kind(mode)}", hint)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        return Problem(path, f"cannot read: {exc.strerror or exc}", "check the path and its permissions")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return Problem(path, f"not read: {file_kind(info.st_mode)}", hint)
        if info.st_size > max_read:
            return Problem(path, f"not read: {info.st_size:,} bytes is over the {max_read:,}-byte read cap",
                           "generated code? exclude it with --exclude")
        chunks = []
        remaining = max_read + 1  # a file growing while it is read still stops at the cap
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        return Problem(path, f"cannot read: {exc.strerror or exc}", "check the path and its permissions")
    finally:
        os.close(fd)
    if len(data) > max_read:
        return Problem(path, f"not read: grew past the {max_read:,}-byte read cap while being read",
                       "generated code? exclude it with --exclude")
    return data


def parse_bytes(data: bytes, path: str, max_bytes: int = MAX_SOURCE_BYTES) -> Union[ParsedSource, Problem]:
    """Decode (PEP 263 cookie or BOM, UTF-8 by default) and parse; anything that goes wrong is a Problem."""
    if len(data) > max_bytes:
        return Problem(
            path,
            f"not scanned: {len(data):,} bytes is over the {max_bytes:,}-byte cap",
            "generated code? exclude it with --exclude",
        )
    hint = "declare the encoding (PEP 263) or save the file as UTF-8"
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        # Bad bytes in the first two lines: detect_encoding says only "invalid declaration"; name the byte.
        encoding, reason = "utf-8", f"cannot decode: {exc}"
    else:
        reason = ""
    try:
        text = data.decode(encoding)
    except LookupError as exc:
        return Problem(path, f"cannot decode: {exc}", hint)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        return Problem(path, f"cannot decode as {exc.encoding}: byte 0x{data[exc.start]:02x} at line {line}", hint)
    if reason:
        return Problem(path, reason, hint)
    return parse_text(text, path)


def decode(data: bytes) -> Optional[str]:
    """The text of a source file decoded as parse_bytes decodes it, newlines made "\n"; None if it cannot be."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = data.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        return None
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def parse_text(text: str, path: str) -> Union[ParsedSource, Problem]:
    # One line ending for everything downstream: the line index, candidate lines and noqa comments count "\n"
    # only, and a file with old Mac "\r" endings is valid Python (ast counts "\r" as a line break too).
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno else ""
        return Problem(path, f"syntax error{where}: {exc.msg}", "fix the syntax; nothing in this file was checked")
    except ValueError as exc:  # NUL bytes on Python < 3.12
        return Problem(path, f"cannot parse: {exc}", "fix the file; nothing in this file was checked")
    except (RecursionError, MemoryError):
        return Problem(path, "too deeply nested to parse", "simplify the nesting or exclude the file")
    return ParsedSource(text, tree)


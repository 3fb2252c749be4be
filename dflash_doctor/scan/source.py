"""Reading one file for the scanner: byte prefilter, size cap, decoding and parsing, each failure a Problem.

Scanned code is never imported or executed: bytes are read, decoded per PEP 263 and handed to `ast.parse`.
"""
from __future__ import annotations

import ast
import io
import os
import re
import stat
import tokenize
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, Optional, Tuple, Union

from dflash_doctor.findings import Problem

# Bigger than any hand-written module (torch's largest source, a generated test table, is 1.4 MB); parsing
# something larger costs memory for nothing a human will fix.
MAX_SOURCE_BYTES = 4 * 1024 * 1024
# Larger files are not even read for the byte prefilter: whatever they are, nobody wrote them by hand.
MAX_READ_BYTES = 64 * 1024 * 1024

# What a file's bytes must contain for each rule to possibly fire: a cheap substring test first, then a
# pattern. Every spelling the rules resolve still names its trigger in the file: torch.utils.checkpoint is
# reached through "utils.checkpoint", "checkpoint.checkpoint", "utils import ... checkpoint" or a relative
# import of it; a spawn site names Thread/Timer/ThreadPool; the other rules name their function or key.
_CHECKPOINT_IMPORT = re.compile(
    rb"utils\.checkpoint|checkpoint\.checkpoint|utils\s+import\s+(?:[^\n;]*|\([^)]*)\bcheckpoint\b"
    rb"|from\s+\.+\s*checkpoint\s+import|from\s+\.+\s+import\s+(?:[^\n;]*|\([^)]*)\bcheckpoint\b"
)
_SPAWN = re.compile(rb"Thread\s*[(),]|Thread\s+as\b|Timer\s*\(|ThreadPool|multiprocessing\.dummy")
# Thread, Timer and the pools resolve only through an import of their module (or a base class that the linker
# follows to one): a file that names none of these cannot start a thread the rules recognise.
_SPAWN_IMPORT = re.compile(rb"threading|concurrent|multiprocessing|class\s+\w+\s*\([^)]*Thread\b")
# A file that applies a mitigation (scan/fixes.py) is read for DFD201 too, though it may start no thread.
_MITIGATION = re.compile(rb"dflash_doctor|force_non_lazy_backward_lowering")
# The function itself: not the module (`flex_attention.noop_mask`, `flex_attention import X`), not a longer name.
_FLEX = re.compile(rb"\bflex_attention\b(?!\s*import\b)(?!\.)")
# torch's flex_attention resolves only through an import that names its module (absolute or relative).
_FLEX_IMPORT = re.compile(rb"nn\.attention\.flex_attention|attention\s+import\s+(?:[^\n;]*|\([^)]*)\bflex_attention\b"
                          rb"|from\s+\.+\s*flex_attention\s+import")
_CONFIG = re.compile(rb"error_on_nested_fx_trace|force_compile_during_fx_trace")
# `supports_gradient_checkpointing = True` (every transformers model class) is not the switch.
_HF = re.compile(rb"(?:gradient|activation)_checkpointing_(?:enable|kwargs)|(?<!\w)gradient_checkpointing\s*=\s*True")
# code -> (words, a pattern that must match near one of them, a pattern the whole file must match or None)
Trigger = Tuple[Tuple[bytes, ...], "re.Pattern[bytes]", Optional["re.Pattern[bytes]"]]
RULE_TRIGGERS: Dict[str, Trigger] = {
    "DFD101": ((b"checkpoint",), _CHECKPOINT_IMPORT, None),
    "DFD102": ((b"checkpoint",), _CHECKPOINT_IMPORT, None),
    "DFD103": ((b"checkpoint",), _CHECKPOINT_IMPORT, None),
    "DFD104": ((b"gradient_checkpointing", b"activation_checkpointing"), _HF, None),
    "DFD201": ((b"Thread", b"Timer", b"multiprocessing.dummy"), _SPAWN, _SPAWN_IMPORT),
    "DFD202": ((b"flex_attention",), _FLEX, _FLEX_IMPORT),
    "DFD301": ((b"_fx_trace",), _CONFIG, None),
}
# DFD101 and DFD103 also fire on gradient_checkpointing_kwargs={"use_reentrant": ...}; DFD201's pass also needs
# the files that apply a mitigation.
_ALSO: Dict[str, Trigger] = {
    "DFD101": RULE_TRIGGERS["DFD104"], "DFD103": RULE_TRIGGERS["DFD104"],
    "DFD201": ((b"dflash_doctor", b"force_non_lazy_backward_lowering"), _MITIGATION, None),
}


_WINDOW = 400  # bytes around each trigger word that a pattern must match in (patterns are line-local)


def _mentions(data: bytes, words, pattern: "re.Pattern[bytes]", requires: Optional["re.Pattern[bytes]"] = None
              ) -> bool:
    """Whether a pattern matches near an occurrence of one of `words` (and `requires` anywhere): the windowed
    regex only ever sees small windows, so a 400 kB file costs a few substring searches, not a regex pass."""
    for word in words:
        start = data.find(word)
        while start != -1:
            if pattern.search(data, max(0, start - _WINDOW), start + _WINDOW):
                return requires is None or requires.search(data) is not None
            start = data.find(word, start + _WINDOW)
    return False


def triggered(data: bytes, enabled: Iterable[str]) -> FrozenSet[str]:
    """The enabled rules that could fire on a file with these bytes (empty: the file need not be parsed)."""
    hits = set()
    seen = {}
    for code in enabled:
        if code not in RULE_TRIGGERS:
            continue  # judged after the files are read (DFD302, unused noqa)
        for trigger in (RULE_TRIGGERS[code],) + ((_ALSO[code],) if code in _ALSO else ()):
            if trigger not in seen:
                seen[trigger] = _mentions(data, *trigger)
            if seen[trigger]:
                hits.add(code)
                break
    return frozenset(hits)


@dataclass(frozen=True)
class ParsedSource:
    text: str
    tree: ast.Module


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words a user recognises."""
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


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


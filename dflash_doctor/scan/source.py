"""Reading one file for the scanner: byte prefilter, size cap, decoding and parsing, each failure a Problem.

Scanned code is never imported or executed: bytes are read, decoded per PEP 263 and handed to `ast.parse`.
"""
from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from typing import Union

from dflash_doctor.findings import Problem

# Bigger than any hand-written module (torch's largest source, a generated test table, is 1.4 MB); parsing
# something larger costs memory for nothing a human will fix.
MAX_SOURCE_BYTES = 4 * 1024 * 1024

# Which byte strings a file must contain for each rule to possibly fire. Every spelling the rules resolve
# (aliases, partials, `from torch import compile`) still names the trigger somewhere in the file: the import.
RULE_TRIGGERS = {
    "DFD101": (b"checkpoint",),
    "DFD102": (b"checkpoint",),
    "DFD103": (b"checkpoint",),
    "DFD104": (b"gradient_checkpointing",),
    # Spawn sites name threading.Thread/Timer, ThreadPoolExecutor or ThreadPool; files that only define
    # functions or compiled callables on a thread's path are loaded on demand while chains are resolved.
    "DFD201": (b"Thread", b"Timer"),
    "DFD202": (b"flex_attention",),
    "DFD301": (b"error_on_nested_fx_trace", b"force_compile_during_fx_trace"),
}


@dataclass(frozen=True)
class ParsedSource:
    text: str
    tree: ast.Module


def read_bytes(path: str) -> Union[bytes, Problem]:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        return Problem(path, f"cannot read: {exc.strerror or exc}", "check the path and its permissions")


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


def parse_text(text: str, path: str) -> Union[ParsedSource, Problem]:
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


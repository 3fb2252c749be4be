"""Text from a log or a file name, made safe to print: control characters shown as escapes.

A file name holding a newline, or a log line holding an ANSI escape sequence, would otherwise write lines of its
own into a report (a forged finding, a cleared screen). Everything dflash-doctor copies from its input into a
finding's message or path goes through `printable`.
"""
from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}
_TABLE = {code: _NAMED.get(chr(code), f"\\x{code:02x}") for code in list(range(32)) + list(range(127, 160))}


def printable(text: str) -> str:
    return text.translate(_TABLE)

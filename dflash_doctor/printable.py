"""Text from outside (file names, log lines, CSV fields) made safe to show: it cannot forge lines or drive the
terminal, and bytes that are not UTF-8 survive as visible escapes instead of crashing the writer.

The one escaping of the house: render/, logs/, report/ and the commands all call it (a core module, so that a
domain below render/ can). A file named `a.py\\nfake.py:1:1: DFD101 ...` or one holding `\\x1b[2J` is shown with
those characters spelled out (`\\n`, `\\x1b`), as are the bidirectional overrides of "Trojan Source". A name that
is not valid UTF-8 reaches Python as lone surrogates (PEP 383); each is shown as the byte it stands for (`\\xff`).
"""
from __future__ import annotations

import re

# C0 controls but tab, DEL, C1 controls, Unicode line/paragraph separators, bidi embeddings/overrides/isolates,
# and surrogates (only ever lone in a decoded str: undecodable bytes, or broken input).
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0 (tab too) and C1 controls, DEL
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}  # tab: only ever escaped with controls_only


def _escape(match: "re.Match[str]") -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the undecodable byte itself
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, keep_newlines: bool = False, controls_only: bool = False) -> str:
    """`text` with every character above spelled out as an escape; `keep_newlines` leaves line breaks alone
    (for text the tool itself laid out over several lines).

    `controls_only` spells out the C0 and C1 controls only, tab included (`\\t`), and leaves the rest as it is:
    what logs/ copies from a log into a finding (a log's name, a line's words) has always been escaped that way,
    so a log's name keeps its undecodable bytes in JSON as scan's names do, and the text console escapes them
    (with the rest of the set above) when it draws."""
    unsafe = _CONTROLS if controls_only else _UNSAFE
    if keep_newlines:
        return "\n".join(unsafe.sub(_escape, line) for line in text.split("\n"))
    return unsafe.sub(_escape, text)


def printable_log(text: str) -> str:
    """`printable` as logs/ shows what it copies from a log or a log's name: the controls only, tab included."""
    return printable(text, controls_only=True)


_SURROGATE = re.compile("[\ud800-\udfff]")


def without_surrogates(text: str) -> str:
    """Only the undecodable bytes spelled out (`\\xff`): for formats that keep other characters as they are
    but must be valid UTF-8 (SARIF, JUnit)."""
    return _SURROGATE.sub(_escape, text)

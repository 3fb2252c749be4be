"""A thread's death logged on one line, and the lines its message goes on over.

Trainers that route `threading.excepthook` through `logging` (the reference pipeline does) write a dead thread
as one record: '2026-12-01 23:46:45 drafter-0 Exception in thread drafter-0: TorchRuntimeError: RuntimeError
when making fake tensor call', then the exception's message on the lines that follow, up to the next record (a
line that starts with a time stamp, a '[' or a level). Those lines name no thread, yet they are drafter-0's: the
cause they hold (Dynamo's 'got NameError(...)' of the FX patcher race) is that death's, not the main thread's.

`OpenRecord` is what the scanner keeps while such a record is open: whose it is, where it began, and whether the
line being read still belongs to it. While one is open the scanner reads every line (it is "busy"), so the
record's end is seen in full logs and in sampled large ones alike.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

# 'Exception in thread NAME: Type: message' on one line; the type as EXCEPTION_LINE spells the usual ones
ONE_LINE_DEATH = re.compile(
    r"\bException in thread (?P<thread>[\w.-]+): (?P<type>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|"
    r"Interrupt|Empty|Failure|Timeout))\b(?::\s?(?P<message>.*))?$")
# a line that starts another record: a time stamp, a bracketed prefix, a level
_RECORD_HEAD = re.compile(rb"^(?:\d|\[|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b)")
RECORD_LINES = 80  # a record's message longer than this is cut: what comes later is read on its own


@dataclass
class OpenRecord:
    thread: str
    line: int  # the record's first line: the death

    def holds(self, raw: bytes, lineno: int) -> bool:
        """Whether `raw` (line `lineno`, as read, before any prefix is taken off) goes on with this record."""
        return 0 < lineno - self.line <= RECORD_LINES and _RECORD_HEAD.match(raw) is None


def one_line_death(body: str) -> "Optional[re.Match[str]]":
    if "Exception in thread " not in body:
        return None
    return ONE_LINE_DEATH.search(body)

"""torchrun's failure summary (ChildFailedError): which ranks failed, how, and which failed first.

The text torch/distributed/elastic/multiprocessing/errors/__init__.py prints when a worker fails:

    torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    ============================================================
    train.py FAILED
    ------------------------------------------------------------
    Failures:
    [1]:
      time      : 2026-11-29_09:41:10
      host      : node0
      rank      : 1 (local_rank: 1)
      exitcode  : -15 (pid: 4243)
      error_file: <N/A>
      traceback : Signal 15 (SIGTERM) received by PID 4243
    ------------------------------------------------------------
    Root Cause (first observed failure):
    [0]:
      ...
      exitcode  : 1 (pid: 4242)
      error_file: /tmp/torchelastic_x/none_y/attempt_0/0/error.json
      traceback : Traceback (most recent call last):
        File "train.py", line 9, in <module>
      RuntimeError: CUDA error: an illegal memory access was encountered
    ============================================================
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional

from dflash_doctor.logs.facts import FailureFacts

from dflash_doctor.rules.logs import SIGNALS

MAX_LINES = 400  # a summary longer than this is cut there
MAX_FAILURES = 64
_ENTRY = re.compile(r"^\s*\[(?P<index>\d+)\]:\s*$")
_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?(?P<value>.*)$")
_RANK = re.compile(r"(?P<rank>\d+)(?: \(local_rank: (?P<local>\d+)\))?")
_EXITCODE = re.compile(r"(?P<code>-?\d+)(?: \(pid: (?P<pid>\d+)\))?")
_SIGNAL = re.compile(r"Signal (?P<num>\d+) \((?P<name>SIG[A-Z]+)\)")
_BORDER = re.compile(r"^\s*(?:={8,}|-{8,})\s*$")
# A summary cut before its headers (grep'd, or pasted from the middle) is still known by its exitcode field, with
# the rank field just before it.
RANK_FIELD = re.compile(r"^\s*rank\s*:\s*\d+ \(local_rank: \d+\)")
EXIT_FIELD = re.compile(r"^\s*exitcode\s*:\s*-?\d+ \(pid: \d+\)")


@dataclass
class Failure:
    rank: Optional[int] = None
    local_rank: Optional[int] = None
    exitcode: Optional[int] = None
    pid: Optional[int] = None
    host: Optional[str] = None
    time: Optional[str] = None
    traceback: List[str] = field(default_factory=list)
    root: bool = False

    @property
    def signal(self) -> Optional[str]:
        named = _SIGNAL.search("\n".join(self.traceback[:2]))
        if named is not None:
            return named.group("name")
        if self.exitcode is not None and self.exitcode < 0:
            return SIGNALS.get(-self.exitcode, f"signal {-self.exitcode}")
        return None

    def text(self) -> str:
        return "\n".join(self.traceback)

    def to_dict(self) -> FailureFacts:
        return {"rank": self.rank, "local_rank": self.local_rank, "exitcode": self.exitcode, "pid": self.pid,
                "host": self.host, "time": self.time, "signal": self.signal, "root_cause": self.root}


class SummaryParser:
    """Fed the lines after 'ChildFailedError' (or a grep'd 'Root Cause' line); `done` once the summary ended."""

    def __init__(self, lineno: int) -> None:
        self.start_line = lineno
        self.failures: List[Failure] = []
        self.done = False
        self._root_section = False
        self._current: Optional[Failure] = None
        self._in_traceback = False
        self._lines = 0
        self.script: Optional[str] = None  # from the 'train.py FAILED' title

    def feed(self, text: str) -> bool:
        """Whether the line belongs to the summary."""
        self._lines += 1
        if self._lines > MAX_LINES:
            self.done = True
            return False
        if "Root Cause (first observed failure)" in text:
            self._root_section, self._current, self._in_traceback = True, None, False
            return True
        if text.strip() == "Failures:" or text.rstrip().endswith(" FAILED"):
            if text.rstrip().endswith(" FAILED"):
                self.script = text.strip()[:-len(" FAILED")].strip()[:200] or None
            return True
        if _BORDER.match(text):
            if text.strip().startswith("=") and self._root_section and self._current is not None:
                self.done = True
            self._in_traceback = False
            return True
        entry = _ENTRY.match(text)
        if entry is not None:
            self._current = Failure(root=self._root_section)
            if len(self.failures) < MAX_FAILURES:
                self.failures.append(self._current)
            self._in_traceback = False
            return True
        field_match = _FIELD.match(text)
        if field_match is not None:
            if self._current is None and len(self.failures) < MAX_FAILURES:
                self._current = Failure(root=self._root_section)  # its '[N]:' line was cut off
                self.failures.append(self._current)
            if self._current is not None:
                self._field(field_match.group("key"), field_match.group("value").strip())
                return True
        if self._current is not None and self._in_traceback and (text.startswith("  ") or not text.strip()):
            if len(self._current.traceback) < 64:
                self._current.traceback.append(text.strip())
            return True
        if not text.strip() or "<NO_OTHER_FAILURES>" in text:
            return True
        if self.failures or self._lines > 3:
            self.done = True
            return False
        return True  # the title lines before 'Failures:'

    def _field(self, key: str, value: str) -> None:
        current = self._current
        if current is None:
            return
        self._in_traceback = key == "traceback"
        if key == "rank":
            match = _RANK.match(value)
            if match:
                current.rank = int(match.group("rank"))
                current.local_rank = int(match.group("local")) if match.group("local") else None
        elif key == "exitcode":
            match = _EXITCODE.match(value)
            if match:
                current.exitcode = int(match.group("code"))
                current.pid = int(match.group("pid")) if match.group("pid") else None
        elif key == "host":
            current.host = value
        elif key == "time":
            current.time = value
        elif key == "traceback":
            current.traceback.append(value)

    @property
    def root(self) -> Optional[Failure]:
        return next((f for f in self.failures if f.root), None)

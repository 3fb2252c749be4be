"""The typed model of `logs` facts (`facts` in the JSON envelope): what scan.py and source.py fill and
render/logs_view.py and status/join.py read. TypedDicts, so the facts stay plain dicts and the JSON is unchanged;
tests/test_facts_shapes.py holds the JSON keys to these models."""
from __future__ import annotations

from typing import Dict, List, Optional, TypedDict


class DeathFacts(TypedDict):
    """How a thread (or rank) died: the line that says so and the cause read there."""

    line: int
    block_line: int
    exception: Optional[str]  # the exception's type, when a traceback or a logger's line named one
    message: str
    code: str  # the rule (DFDxxx) that read the death
    last_frame: Optional[str]
    last_step: Optional[int]
    gpu: Optional[int]
    signal: Optional[str]
    kind: str  # "signal" for a death by signal, else what ended it
    root_cause: bool  # torchrun named its rank the first to fail


class ThreadFacts(TypedDict):
    """One worker's progress as the log shows it, and its death if it died."""

    last_step: Optional[int]
    last_step_line: Optional[int]
    last_tok_s: Optional[float]
    last_rate: Optional[float]
    rate_unit: Optional[str]
    progress_lines: int
    died: Optional[DeathFacts]


class FailureFacts(TypedDict):
    """One failed rank in torchrun's summary (logs/torchrun.py Failure.to_dict)."""

    rank: Optional[int]
    local_rank: Optional[int]
    exitcode: Optional[int]
    pid: Optional[int]
    host: Optional[str]
    time: Optional[str]
    signal: Optional[str]
    root_cause: bool


class RootCauseFacts(FailureFacts):
    """torchrun's first failure and the line its summary starts on."""

    line: int


class _LogsFactsAlways(TypedDict):
    path: str
    lines: int
    bytes: int
    exceptions: int  # traceback blocks
    threads: Dict[str, ThreadFacts]


class LogsFacts(_LogsFactsAlways, total=False):
    """The keys in the base class are there even for a log that could not be read; the rest come from a scan
    (`compression` from a file, `restarts` from --follow). (Required keys live in a base class: typing.Required
    is Python 3.11+, and the tool runs on 3.9.)"""

    root_cause: Optional[RootCauseFacts]
    untracked_threads: int
    progress_sampled: bool
    repeats: Dict[str, int]
    suppressed: Dict[str, int]
    next_steps: List[str]
    compression: Optional[str]
    restarts: int

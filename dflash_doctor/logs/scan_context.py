"""What the parts of one log scan share: where it is, the workers' names and progress, the rules' line memory, the
findings made so far and the death ledger, plus the three ways every part makes a finding.

One object per scan, handed to each part (intake.py, line_rules.py, tracebacks.py, torchrun_findings.py,
dump_findings.py, held_lines.py), so that no part reaches into another's state and the scanner only wires them.
"""
from __future__ import annotations

from typing import Any, Dict, Generic, List, Optional, Protocol, Tuple, TypeVar

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.logs.cursor import Cursor
from dflash_doctor.logs.death_ledger import DeathLedger
from dflash_doctor.logs.emitted import EmittedFindings
from dflash_doctor.logs.lines import WorkerNames
from dflash_doctor.logs.options import LogOptions
from dflash_doctor.logs.scan_common import MAIN, MESSAGE_CHARS
from dflash_doctor.logs.worker_progress import TOTAL, DropEvent, ProgressTracker
from dflash_doctor.rules.catalog import lookup
from dflash_doctor.rules.logs import LOG_THROUGHPUT_DROP, LineMemory, LogRule
from dflash_doctor.rules.registry import Rule


class SpanReader(Protocol):
    """A part that reads something spanning lines to its end (torchrun's summary, a stack dump). While one is open,
    every line goes to it before anything else, and intake hands over every line (the scanner is busy)."""

    def is_open(self) -> bool: ...

    def take(self, body: str) -> Tuple[bool, List[Finding]]:
        """(whether it took the line, the findings its end gave: a line it does not take ends it too)"""

    def end(self) -> List[Finding]: ...


class SpanParser(Protocol):
    """What a SpanReader feeds: a parser that says whether it took a line and when its span is over."""

    done: bool

    def feed(self, text: str) -> bool: ...


P = TypeVar("P", bound=SpanParser)


class OpenSpan(Generic[P]):
    """The half of a SpanReader every span shares: the parser open now, fed until a line it does not take (which
    ends it) or its own end. A subclass opens `open` and says in `end` what the finished span found."""

    open: Optional[P] = None

    def is_open(self) -> bool:
        return self.open is not None

    def take(self, body: str) -> Tuple[bool, List[Finding]]:
        """Feed the open span: (whether it took the line, what its end found)."""
        if self.open is None:
            return False, []
        if self.open.feed(body):
            return True, self.end() if self.open.done else []
        return False, self.end()

    def end(self) -> List[Finding]:
        raise NotImplementedError


class ScanContext:
    def __init__(self, path: str, options: LogOptions) -> None:
        self.path = path
        self.options = options
        self.cursor = Cursor()
        self.names = WorkerNames()
        self.memory = LineMemory()  # what the rules' line hooks keep from line to line
        self.progress = ProgressTracker(options.baseline_window, options.sustain, options.drop, options.stall_steps,
                                        unnamed=MAIN)
        self.emitted = EmittedFindings(path, options.max_findings_per_code)
        self.deaths = DeathLedger(self.cursor, self.names, self.progress, self.emitted)

    def emit(self, rule: Rule, key: tuple, message: str, line: int, evidence: Dict[str, Any],
             severity: Optional[Severity] = None) -> List[Finding]:
        return self.emitted.emit(rule, key, message, line, evidence, severity)

    def cause(self, entry: LogRule, details: Dict[str, Any], worker: str, line: int,
              block_line: Optional[int] = None) -> List[Finding]:
        """A rule's finding for what it read (in a traceback starting on `block_line`, or on a line of its own)."""
        evidence = dict(details, thread=worker, block_line=block_line, last_step=self.deaths.last_step(worker))
        return self.emit(entry.rule, entry.finding_key(worker, details),
                         f"{worker}: {entry.message(details)}"[:MESSAGE_CHARS * 2], line, evidence,
                         severity=entry.severity_of(details, lookup))

    def drops(self, drops: List[DropEvent]) -> List[Finding]:
        new: List[Finding] = []
        for drop in drops:
            who = "all workers together" if drop.thread == TOTAL else drop.thread
            how = " by the end of the log" if drop.at_end else ""
            new += self.emit(
                LOG_THROUGHPUT_DROP, (drop.thread, drop.unit, drop.from_line),
                f"{who}: throughput fell from {drop.baseline:,.0f} to {drop.level:,.0f} {drop.unit} "
                f"({100 * (1 - drop.level / drop.baseline):.0f} % lower) from line {drop.from_line}{how}",
                drop.from_line, {"thread": drop.thread, "unit": drop.unit, "from": drop.baseline, "to": drop.level,
                                 "from_line": drop.from_line, "sustained_at_line": drop.line, "at_end": drop.at_end})
        return new

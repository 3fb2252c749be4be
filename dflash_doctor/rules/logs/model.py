"""What a log rule is: the `LogRule` declaration, the hooks a rule may give, what they may use of the scanner, and
`declare`, which every family module calls once per rule.

Declaring says nothing about order: which rule takes a line or an exception several rules match is precedence.py's
PRECEDENCE, and the package (`dflash_doctor.rules.logs`) hands the scanner LOG_RULES in that order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from dflash_doctor.findings import Finding, Severity
from dflash_doctor.rules.registry import Rule, register

Details = Callable[["re.Match[str]", str], Dict[str, Any]]
# What to do next about a rule's findings: (its findings, most severe first; the threads of the facts; how many
# threads a repro should start) -> steps, or None for the rule's fix (logs/next_steps.py).
NextSteps = Callable[[Sequence[Finding], Dict[str, dict], int], Optional[List[str]]]

UNNAMED = "main"  # the worker of a line that names none
ABORT_LINES = 20  # the C++ terminate lines that follow a watchdog abort within this many lines are its


def _no_details(match: "re.Match[str]", text: str) -> Dict[str, Any]:
    return {}


def _per_worker(worker: str, details: Dict[str, Any]) -> tuple:
    return (worker,)


# Any rule by code or name (rules/catalog.py lookup), handed to a hook by the scanner: a rule table cannot import the
# catalog, which imports every table (DFD522 reads back another rule's code and needs its severity).
RuleLookup = Callable[[str], Optional[Rule]]


def _rule_severity(details: Dict[str, Any], lookup: RuleLookup) -> Optional[Severity]:
    return None


@dataclass
class HeldLine:
    """A matched line whose finding waits for what follows it, or for the end of the log."""

    worker: str
    lineno: int
    body: str = ""
    details: Dict[str, Any] = field(default_factory=dict)


@dataclass
class HeldRecompile(HeldLine):
    """The recompile-limit warning, waiting up to RECOMPILE_LOOKAHEAD lines for its 'function:' line."""

    function: Optional[str] = None
    lines_seen: int = 0


@dataclass
class LineMemory:
    """What the rules' line hooks remember from one line to the next; the scanner reports the held lines when they
    are due (a later line, ABORT_LINES on, the end of the log)."""

    last_timeout: int = -ABORT_LINES - 1  # line of the last collective timeout
    last_abort: Optional[HeldLine] = None  # the last watchdog-abort line that named its worker
    held_abort: Optional[HeldLine] = None  # a 'terminate called' line waiting for its rank
    launcher_cut: Optional[HeldLine] = None  # DeepSpeed's launcher line, its return code cut off
    held_recompile: Optional[HeldRecompile] = None
    pyspy_header: Optional[HeldLine] = None  # py-spy's 'Process N:' line with no thread after it (yet)
    fatal_error_line: Optional[int] = None  # 'Fatal Python error': a faulthandler dump after it is the crash's
    limit_set: Optional[HeldLine] = None  # the last line that set a recompile limit ('recompile_limit = 64')


@dataclass(frozen=True)
class RuleLine:
    """A line that one rule's pattern matched, handed to that rule's hook."""

    body: str
    lineno: int
    stream: Optional[str]  # the worker its prefix names, if any
    worker: str
    match: "re.Match[str]"


class RuleScanner(Protocol):
    """What a rule's hook may use of the scanner reading the line: dflash_doctor/logs/line_rules.py RuleLines,
    the part of the scanner that reads a line outside a traceback."""

    memory: LineMemory

    def line_before(self) -> Optional[str]: ...

    def start_dump(self, lineno: int, stream: Optional[str], text: str) -> None: ...

    def report(self, rule: Rule, key: tuple, message: str, lineno: int, evidence: Dict[str, Any]) -> None: ...

    def is_dead(self, worker: str) -> bool: ...


# A rule's own handling of its line, before the scanner reports the usual finding (and the death, for a fatal rule):
# `on_match` takes the line as it is (no finding of the usual kind follows); `on_line` sees it with its details and
# its worker resolved, and returns the worker the finding goes to, or None when it held or dropped the line.
MatchHook = Callable[[RuleScanner, RuleLine], None]
LineHook = Callable[[RuleScanner, RuleLine, Dict[str, Any]], Optional[str]]


@dataclass(frozen=True)
class LogRule:
    """How the log scanner recognises one DFD5xx rule.

    `fatal`: a match inside a traceback's exception, or on a bare exception line, names why a worker died (the
    rules are tried in precedence.py's order, so a narrower kind placed first wins: the jit.trace message before
    the FX race, Triton's OutOfResources before CUDA OOM). `describe` turns the details into the finding's message
    after 'WORKER: '. `line_is_death`: the matched line alone means the process is gone (no exception line needed),
    of `death_kind`. `finding_key`: findings with the same key are one finding (repeats are counted).
    `records_only`: judged on warning and error records only, never on a glog INFO record. `explains_cut_traceback`:
    a traceback cut before its exception shortly after this rule's finding for a worker is that death's."""

    rule: Rule
    triggers: Tuple[str, ...] = ()
    pattern: Optional["re.Pattern[str]"] = None
    fatal: bool = False
    details: Details = _no_details
    describe: Optional[Callable[[Dict[str, Any]], str]] = None
    on_match: Optional[MatchHook] = None
    on_line: Optional[LineHook] = None
    line_is_death: bool = False
    death_kind: str = "process"
    finding_key: Callable[[str, Dict[str, Any]], tuple] = _per_worker
    severity_of: Callable[[Dict[str, Any], RuleLookup], Optional[Severity]] = _rule_severity
    records_only: bool = False
    explains_cut_traceback: bool = True
    # Whether the rule explains a traceback whose exception it matched: (the match, whether the traceback is a
    # thread's, its frames' functions outermost first). By default every match does.
    explains_block: Optional[Callable[["re.Match[str]", bool, Tuple[str, ...]], bool]] = None
    next_steps: Optional[NextSteps] = None  # what to run or read next; by default the rule's fix
    # The worker a cause names itself, whatever the line's prefix says (a DataParallel replica: 'replica 0').
    worker_of: Optional[Callable[[Dict[str, Any]], Optional[str]]] = None

    def message(self, details: Dict[str, Any]) -> str:
        return self.describe(details) if self.describe is not None else self.rule.summary


DECLARED: Dict[str, LogRule] = {}  # by code, as the family modules declare them (their order decides nothing)


def declare(rule: Rule, **matcher: Any) -> Rule:
    """Register `rule` and how the scanner finds it (its place among the others: precedence.py)."""
    if rule.example_format != "log":
        raise ValueError(f"{rule.code}: log rules are written as log excerpts")
    DECLARED[rule.code] = LogRule(register(rule), **matcher)
    return rule

"""The one result model shared by every command: findings, problems, facts and the exit code they imply.

Analysis code builds these and returns them; only renderers and the CLI turn them into output.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Generic, List, Mapping, Optional, Tuple, TypedDict, cast

if TYPE_CHECKING:
    # PEP 696 defaults (typing.TypeVar takes `default=` from 3.13 only): a bare `Report` keeps untyped facts.
    from typing_extensions import TypeVar

    FactsT = TypeVar("FactsT", default=Any)
else:
    from typing import TypeVar

    FactsT = TypeVar("FactsT")


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        return {"info": 1, "warning": 2, "error": 3}[self.value]


class FailOn(str, enum.Enum):
    """Lowest severity that makes the exit code 1 (`never`: findings never fail the run)."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    NEVER = "never"

    def trips(self, severity: Severity) -> bool:
        if self is FailOn.NEVER:
            return False
        return severity.rank >= Severity(self.value).rank


# Exit-code bits shared by all analysis commands (repro documents its own 0/1/2/3 scheme).
EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 4


@dataclass(frozen=True)
class Finding:
    code: str
    name: str
    severity: Severity
    message: str
    path: Optional[str] = None
    line: Optional[int] = None
    column: Optional[int] = None  # 1-based, like the editors and SARIF
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def sort_key(self) -> Tuple[str, int, int, str]:
        return (self.path or "", self.line or 0, self.column or 0, self.code)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "message": self.message,
            "path": self.path,
            "line": self.line,
            "column": self.column,
            "evidence": dict(self.evidence),
        }


@dataclass(frozen=True)
class Problem:
    """Something that could not be checked: never a finding, never a crash."""

    subject: str
    reason: str
    hint: str = ""

    def to_dict(self) -> Dict[str, str]:
        return {"subject": self.subject, "reason": self.reason, "hint": self.hint}


class PartialFacts(TypedDict):
    """`facts.partial` of a run a signal ended early (Report.mark_stopped): a facts model that can hold it
    declares it as an optional key of this type."""

    stopped_by: str  # SIGINT | SIGTERM | max-time (repro --max-time)
    unfinished: str  # what did not finish, in words


def stopped_facts(signal_name: str, unfinished: str) -> PartialFacts:
    return {"stopped_by": signal_name, "unfinished": unfinished}


def _empty_facts() -> Any:
    return {}


@dataclass
class Report(Generic[FactsT]):
    """`Report[LogsFacts]`: a command whose facts have a typed model (a TypedDict next to the analysis that fills
    it, e.g. logs/facts.py) says so, and its renderer reads keys mypy checks; a bare `Report` has untyped facts.
    At run time facts are always a plain dict, so the JSON envelope is the same either way."""

    command: str
    findings: List[Finding] = field(default_factory=list)
    problems: List[Problem] = field(default_factory=list)
    facts: FactsT = field(default_factory=_empty_facts)  # the command's own data: `facts` in the JSON envelope
    # Commands with their own exit-code contract (repro) set this; others derive it from findings/problems.
    exit_code_override: Optional[int] = None
    # The closing line's words in place of the finding counts, where the command has a verdict to say (repro).
    summary: Optional[str] = None
    stopped_by: Optional[str] = None  # "SIGINT" / "SIGTERM" when a signal ended the run early (mark_stopped)

    def mark_stopped(self, signal_name: str, unfinished: str) -> None:
        """A signal ended a multi-phase run early: what finished stays in the report, `facts.partial` says what
        did not, and the exit code is the shell's 128 + the signal (130 SIGINT, 143 SIGTERM)."""
        import signal

        self.stopped_by = signal_name
        cast(Dict[str, Any], self.facts)["partial"] = stopped_facts(signal_name, unfinished)
        self.problems.append(Problem(self.command, f"stopped by {signal_name} before the end: {unfinished}",
                                     "what had finished is reported; run it again to complete it"))
        self.exit_code_override = 128 + int(signal.Signals[signal_name])

    def extend(self, other: "Report[Any]") -> None:
        self.findings.extend(other.findings)
        self.problems.extend(other.problems)

    def sorted_findings(self) -> List[Finding]:
        return sorted(self.findings, key=Finding.sort_key)

    def exit_code(self, fail_on: FailOn = FailOn.WARNING) -> int:
        if self.exit_code_override is not None:
            return self.exit_code_override
        code = EXIT_CLEAN
        if any(fail_on.trips(f.severity) for f in self.findings):
            code |= EXIT_FINDINGS
        if self.problems:
            code |= EXIT_PROBLEMS
        return code

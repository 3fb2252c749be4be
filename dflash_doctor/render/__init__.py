"""Output formats. Renderers are the only code (besides cli.py) that writes to the terminal.

`OutputFormat` is the one list of formats; `formatter_for` maps each to its formatter (render/formats.py) and ends
in `assert_never`, so a format added to the enum without a formatter fails the type check and the tests instead
of falling through to another format's output.
"""
from __future__ import annotations

import enum
import sys
from typing import TYPE_CHECKING, Callable, NoReturn, Optional, TextIO, TypeVar

from dflash_doctor.findings import FailOn, Report

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.render.formats import Formatter


class OutputFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    SARIF = "sarif"
    JUNIT = "junit"


F = TypeVar("F")
# A facts view draws a command's facts in the text format (tables, timelines); it receives a rich Console and the
# report's facts, of the report's facts type: `FactsView[LogsFacts]` goes with a `Report[LogsFacts]`.
FactsView = Callable[["Console", F], None]


def assert_never(value: NoReturn) -> NoReturn:
    """typing.assert_never (Python 3.11+), for the interpreters before it."""
    raise AssertionError(f"unhandled value: {value!r}")


def formatter_for(fmt: OutputFormat) -> "Formatter":
    # Imported per branch: the SARIF and JUnit writers (rule registry, ElementTree) load only when asked for.
    from dflash_doctor.render import formats

    if fmt is OutputFormat.TEXT:
        return formats.TextFormatter()
    if fmt is OutputFormat.JSON:
        return formats.JsonFormatter()
    if fmt is OutputFormat.SARIF:
        return formats.SarifFormatter()
    if fmt is OutputFormat.JUNIT:
        return formats.JunitFormatter()
    assert_never(fmt)


def emit(
    report: Report[F],
    fmt: OutputFormat,
    fail_on: FailOn = FailOn.WARNING,
    *,
    facts_view: Optional[FactsView[F]] = None,
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
) -> int:
    """Write `report` in `fmt` (report to stdout, problems and summary to stderr) and return its exit code."""
    # Older typer releases hand an unannotated enum option over as its plain string: accept both.
    fmt = OutputFormat(fmt)
    fail_on = FailOn(fail_on)
    exit_code = report.exit_code(fail_on)
    formatter_for(fmt).write(report, out or sys.stdout, err or sys.stderr, exit_code=exit_code, fail_on=fail_on,
                             facts_view=facts_view)
    return exit_code

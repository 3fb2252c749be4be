"""Output formats. Renderers are the only code (besides cli.py) that writes to the terminal.

`OutputFormat` (the one list of formats) and the formatter of each are declared in render/formats.py, whose
`FORMATTERS` map is checked exhaustive at import; `formatter_for` looks a format up there, and anything that is
not a member is an error, never another format's output.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable, NoReturn, Optional, TextIO, TypeVar

from dflash_doctor.findings import FailOn, Report
from dflash_doctor.render.formats import FORMATTERS, OutputFormat

if TYPE_CHECKING:
    from rich.console import Console

    from dflash_doctor.render.formats import Formatter


F = TypeVar("F")
# A facts view draws a command's facts in the text format (tables, timelines); it receives a rich Console and the
# report's facts, of the report's facts type: `FactsView[LogsFacts]` goes with a `Report[LogsFacts]`.
FactsView = Callable[["Console", F], None]


def assert_never(value: NoReturn) -> NoReturn:
    """typing.assert_never (Python 3.11+), for the interpreters before it."""
    raise AssertionError(f"unhandled value: {value!r}")


def formatter_for(fmt: OutputFormat) -> "Formatter":
    # The formatters import their writers (rule registry, ElementTree) only when they write.
    formatter = FORMATTERS.get(fmt) if isinstance(fmt, OutputFormat) else None
    if formatter is None:
        assert_never(fmt)  # type: ignore[arg-type]
    return formatter()


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

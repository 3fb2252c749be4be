"""Output formats. Renderers are the only code (besides cli.py) that writes to the terminal."""
from __future__ import annotations

import enum
import sys
from typing import Callable, Optional, TextIO

from dflash_doctor.findings import FailOn, Report


class OutputFormat(str, enum.Enum):
    TEXT = "text"
    JSON = "json"
    SARIF = "sarif"
    JUNIT = "junit"


# A facts view draws a command's facts in the text format (tables, timelines); it receives a rich Console.
FactsView = Callable[[object, dict], None]


def emit(
    report: Report,
    fmt: OutputFormat,
    fail_on: FailOn = FailOn.WARNING,
    *,
    facts_view: Optional[FactsView] = None,
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
) -> int:
    """Write `report` in `fmt` (report to stdout, problems and summary to stderr) and return its exit code."""
    # Older typer releases hand an unannotated enum option over as its plain string: accept both.
    fmt = OutputFormat(fmt)
    fail_on = FailOn(fail_on)
    out = out or sys.stdout
    err = err or sys.stderr
    exit_code = report.exit_code(fail_on)
    if fmt is OutputFormat.TEXT:
        from dflash_doctor.render.text import render_text

        render_text(report, out, err, facts_view=facts_view, exit_code=exit_code)
        return exit_code
    if fmt is OutputFormat.JSON:
        from dflash_doctor.render.json_format import render_json

        document = render_json(report, exit_code)
    elif fmt is OutputFormat.SARIF:
        from dflash_doctor.render.sarif import render_sarif

        document = render_sarif(report, exit_code)
    else:
        from dflash_doctor.render.junit import render_junit

        # JUnit marks as failures exactly the findings at or above --fail-on; the others pass with details.
        document = render_junit(report, exit_code, fail_on)
    out.write(document)
    out.write("\n")
    from dflash_doctor.render.text import render_problems_and_summary

    render_problems_and_summary(report, err, exit_code)
    return exit_code

"""Options and output plumbing every subcommand shares, so formats, --fail-on and --output behave alike."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from dflash_doctor.findings import FailOn, Report
from dflash_doctor.render import FactsView, OutputFormat, emit

FORMAT_OPTION = typer.Option(OutputFormat.TEXT, "--format", "-f", help="Report format.", case_sensitive=False)
FAIL_ON_OPTION = typer.Option(
    FailOn.WARNING, "--fail-on", help="Lowest severity that makes the exit code 1.", case_sensitive=False
)
OUTPUT_OPTION = typer.Option(
    None, "--output", "-o", help="Write the report to this file instead of stdout (written atomically).",
    dir_okay=False,
)

EXIT_CODES_HELP = (
    "Exit codes: 0 clean; 1 findings at or above --fail-on; 2 usage error; 4 something could not be checked "
    "(bit-or'ed with 1, so 5 is both)."
)


def finite(value: Optional[float], option: str, *, minimum: Optional[float] = None,
           maximum: Optional[float] = None, inclusive_minimum: bool = True) -> Optional[float]:
    """`value` if it is a finite number in range (None passes through), else a UsageError naming `option`.

    click's FloatRange lets NaN through (every comparison with NaN is false), and a NaN timeout disables the
    very watchdog it configures, so every float option goes through here."""
    import math

    from dflash_doctor.errors import UsageError

    if value is None:
        return None
    if not math.isfinite(value):
        raise UsageError(f"{option} must be a finite number, got {value}")
    low_ok = minimum is None or (value >= minimum if inclusive_minimum else value > minimum)
    if not low_ok or (maximum is not None and value > maximum):
        bound = (f" {'>=' if inclusive_minimum else '>'} {minimum:g}" if minimum is not None else "") + (
            f"{' and' if minimum is not None else ''} <= {maximum:g}" if maximum is not None else "")
        raise UsageError(f"{option} must be{bound}, got {value:g}")
    return value


def write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename, so a reader never sees half a report."""
    import tempfile  # here, not at the top: only --output needs it, and start-up time is a target (issue 7)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def finish(
    report: Report,
    fmt: OutputFormat,
    fail_on: FailOn = FailOn.WARNING,
    output: Optional[Path] = None,
    facts_view: Optional[FactsView] = None,
) -> int:
    """Render `report` to stdout or `output` and return the exit code the command should end with."""
    if output is None:
        return emit(report, fmt, fail_on, facts_view=facts_view)
    import io

    buffer = io.StringIO()
    code = emit(report, fmt, fail_on, facts_view=facts_view, out=buffer)
    write_atomically(output, buffer.getvalue())
    return code


DEBUG = False  # set by the root callback's --debug


def error_line(message: str) -> None:
    import sys

    sys.stderr.write(f"dflash-doctor: error: {message}\n")


def guarded(command):
    """Run a command body: its int return is the exit code; domain errors become one line and their exit code.

    Anything unexpected is one line too (exit 3) unless --debug asks for the traceback.
    """
    import functools

    from dflash_doctor.errors import DoctorError

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            code = command(*args, **kwargs)
        except typer.Exit:
            raise
        except DoctorError as exc:
            if DEBUG:
                raise
            error_line(str(exc))
            raise typer.Exit(exc.exit_code)
        except KeyboardInterrupt:
            error_line("interrupted")
            raise typer.Exit(130)
        except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback, unless --debug
            if DEBUG:
                raise
            error_line(f"internal error: {exc.__class__.__name__}: {exc} (rerun with --debug for the traceback)")
            raise typer.Exit(3)
        raise typer.Exit(code or 0)

    return wrapper

"""Options and output plumbing every subcommand shares, so formats, --fail-on, --output and errors behave alike."""
from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, TextIO, Tuple

import typer

from dflash_doctor.errors import Terminated, UsageError, finite  # they live with the errors; commands import here
from dflash_doctor.findings import EXIT_PROBLEMS, FailOn, Problem, Report
from dflash_doctor.outputs import check_output, write_atomically
from dflash_doctor.render import F, FactsView, OutputFormat, emit, formatter_for

__all__ = [
    "EXIT_CODES_HELP", "FAIL_ON_OPTION", "FORMAT_OPTION", "OUTPUT_OPTION", "QUIET_OPTION", "check_output", "error_line", "finish",
    "finite", "guarded", "write_artifact", "write_document", "write_atomically",
]

FORMAT_OPTION = typer.Option(OutputFormat.TEXT, "--format", "-f", help="Report format.", case_sensitive=False)
FAIL_ON_OPTION = typer.Option(
    FailOn.WARNING, "--fail-on", help="Lowest severity that makes the exit code 1.", case_sensitive=False
)
OUTPUT_OPTION = typer.Option(
    None, "--output", "-o", help="Write the report to this file instead of stdout (written atomically; never over "
    "an input; if it cannot be written after the run, the report goes to a temporary file named on stderr).",
    dir_okay=False,
)
QUIET_OPTION = typer.Option(False, "--quiet", "-q", help="No progress lines on stderr while it runs.")

EXIT_CODES_HELP = (
    "Exit codes: 0 clean; 1 findings at or above --fail-on; 2 usage error; 4 something could not be checked "
    "(bit-or'ed with 1, so 5 is both)."
)
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
EXIT_TERMINATED = 143  # 128 + SIGTERM
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a tool whose reader went away


class _StderrBuffer(io.StringIO):
    """Holds the summary lines while the report is written elsewhere; looks like stderr to rich, so colours
    follow the real terminal."""

    def isatty(self) -> bool:
        return sys.stderr.isatty()


def _fallback_file(command: str, suffix: str) -> Optional[str]:
    """A fresh private file in the temporary folder for a report that could not go where it was asked."""
    import tempfile

    try:
        fd, path = tempfile.mkstemp(prefix=f"dflash-doctor-{command}-", suffix=suffix)
    except OSError:
        return None
    os.close(fd)
    return path


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or exc.__class__.__name__


def _deliver(text: str, fallback: Optional[str]) -> str:
    """Write `text` to `fallback`, or to stdout when there is none or it fails; returns where it went."""
    if fallback is not None:
        try:
            with open(fallback, "w", encoding="utf-8", errors="backslashreplace") as handle:
                handle.write(text)
            return fallback
        except OSError:
            pass
    sys.stdout.write(text)
    return "stdout"


def _note_unwritten(report: Report, option: str, path: Path, exc: OSError, where: str) -> None:
    report.problems.append(Problem(f"{option} {path}", f"could not be written ({_reason(exc)})",
                                   f"it is in {where} instead"))
    if report.exit_code_override is not None and report.stopped_by is None:  # repro's own scheme: keep its
        # verdict, add the problems bit (a signal's 130/143 stays as it is)
        report.exit_code_override |= EXIT_PROBLEMS


def finish(
    report: Report[F],
    fmt: OutputFormat,
    fail_on: FailOn = FailOn.WARNING,
    output: Optional[Path] = None,
    facts_view: Optional[FactsView[F]] = None,
    report_stream: Optional[TextIO] = None,
) -> int:
    """Render `report` to stdout (or `report_stream`: `run` keeps stdout for the user's command) or `output` and
    return the exit code the command should end with.

    A report that cannot be written to `output` at the end of a run (folder gone, disk full, no reader on a
    FIFO) is not lost: it goes to a temporary file (else stdout) with a problem saying so, which sets exit bit 4.
    """
    if output is None:
        code = emit(report, fmt, fail_on, facts_view=facts_view, out=report_stream)
        _say_stopped(report)
        return code
    out, err = io.StringIO(), _StderrBuffer()
    code = emit(report, fmt, fail_on, facts_view=facts_view, out=out, err=err)
    try:
        write_atomically(output, out.getvalue())
    except OSError as exc:
        fallback = _fallback_file(report.command, formatter_for(OutputFormat(fmt)).suffix)
        _note_unwritten(report, "--output", output, exc, fallback or "stdout")
        out, err = io.StringIO(), _StderrBuffer()
        code = emit(report, fmt, fail_on, facts_view=facts_view, out=out, err=err)
        _deliver(out.getvalue(), fallback)
    sys.stderr.write(err.getvalue())
    _say_stopped(report)
    return code


def _say_stopped(report: Report) -> None:
    """The one line a signal ends a command with, after the partial report it wrote."""
    if report.stopped_by is not None:
        error_line(f"{'terminated' if report.stopped_by == 'SIGTERM' else 'interrupted'}: the report holds what "
                   "had finished (marked partial)")


def write_artifact(report: Report, option: str, path: Optional[Path], write: Callable[[Path], None],
                   suffix: str = ".json") -> None:
    """Call `write(path)` for a file the command produces beside its report (repro's --trace); when that
    fails, write it to a temporary file instead and add a problem to `report` naming both."""
    if path is None:
        return
    try:
        write(Path(path))
    except OSError as exc:
        fallback = _fallback_file(f"{report.command}-{option.lstrip('-')}", suffix)
        where = "nowhere"
        if fallback is not None:
            try:
                write(Path(fallback))
                where = fallback
            except OSError:
                pass
        _note_unwritten(report, option, Path(path), exc, where)


def write_document(path: Path, text: str, option: str, command: str, suffix: str) -> Tuple[int, str]:
    """Write a finished document (report's Markdown/HTML) to `path`; on failure to a temporary file or stdout.
    Returns (0, where) when written as asked, else (EXIT_PROBLEMS, a line saying what happened and where)."""
    try:
        write_atomically(path, text)
        return 0, str(path)
    except OSError as exc:
        where = _deliver(text, _fallback_file(command, suffix))
        return EXIT_PROBLEMS, f"{option} {path} could not be written ({_reason(exc)}); it is in {where} instead"


DEBUG = False  # set by the root callback's --debug


def error_line(message: str) -> None:
    """The one line every error is: escaped, so a path in it cannot break it in two or drive the terminal."""
    from dflash_doctor.printable import printable

    sys.stderr.write(f"dflash-doctor: error: {printable(message)}\n")




# Options that are durations, with the factor that turns their unit into seconds. Each is capped at
# MAX_DURATION_S: a timeout of 1e300 s is no timeout (pass a large one), and past about 3e11 s the deadline
# `time.monotonic() + timeout` no longer fits a C timestamp (OverflowError inside a wait).
DURATION_OPTIONS: Dict[str, float] = {
    "--timeout": 1.0, "--hang-after": 1.0, "--interval": 1.0, "--max-seconds": 1.0, "--stall-timeout": 1.0,
    "--max-time": 1.0, "--amplify-ms": 1e-3,
}
MAX_DURATION_S = 7 * 24 * 3600.0  # a week


def bounded_duration(value: Optional[float], option: str) -> None:
    """A duration option within MAX_DURATION_S (in its own unit), else a UsageError naming the cap."""
    factor = DURATION_OPTIONS[option]
    if value is not None and abs(value) * factor > MAX_DURATION_S:
        limit = MAX_DURATION_S / factor
        raise UsageError(f"{option} must be at most {limit:g} ({MAX_DURATION_S / 86400:g} days), got {value:g}")


def preflight_inputs(command, values: Dict[str, object]) -> None:
    """Every declared input the command was given, checked (inputs.preflight) and noted before the body runs."""
    from dflash_doctor.inputs import declared_inputs, preflight

    for option, spec, value in declared_inputs(command, values):
        preflight(value, spec, option)


def _float_options(command) -> Dict[str, str]:
    """{parameter: option name} for every float option of a typer command function."""
    import inspect
    import typing

    hints = typing.get_type_hints(command)
    found = {}
    for name, parameter in inspect.signature(command).parameters.items():
        if hints.get(name) not in (float, Optional[float]):
            continue
        declared = [d for d in getattr(parameter.default, "param_decls", ()) or () if d.startswith("--")]
        found[name] = declared[0] if declared else "--" + name.replace("_", "-")
    return found


def streams_without_reader() -> List[int]:
    """The file descriptors of stdout/stderr whose reader has gone (`dflash-doctor scan -f json | head -c 10`),
    as opposed to a pipe to a child breaking, which is a real error."""
    import select

    gone = []
    for stream in (sys.stdout, sys.stderr):
        try:
            poller = select.poll()
            fd = stream.fileno()
            poller.register(fd, select.POLLOUT)
            if any(events & select.POLLERR for _, events in poller.poll(0)):
                gone.append(fd)
        except (AttributeError, OSError, ValueError):  # no poll (Windows), or the stream is already closed
            continue
    return gone


def quiet_exit_on_broken_pipe(fds: Sequence[int]) -> None:
    """The reader went away: stop without a word, as other command-line tools do. Later writes to those
    streams, the interpreter's final flush included, go to /dev/null instead of raising again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in fds:
            os.dup2(devnull, fd)
    except OSError:
        pass
    sys.exit(EXIT_BROKEN_PIPE)


def guarded(command):
    """Run a command body: its int return is the exit code; domain errors become one line and their exit code.

    Before the body runs, every float option is checked to be finite (NaN passes click's range checks), every
    duration to be within MAX_DURATION_S, and every declared input (inputs.py) to be something it can read.
    Anything unexpected is one line too (exit 3); --debug adds the traceback above the line, with the same exit
    code. On every way out (return, error, Ctrl-C, SIGTERM) the children it started are stopped.
    """
    import functools

    from dflash_doctor import children
    from dflash_doctor.errors import DoctorError

    def fail(message: str, code: int) -> None:
        if DEBUG:
            import traceback

            traceback.print_exc()
        error_line(message)
        raise typer.Exit(code)

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            for name, option in _float_options(command).items():  # here: only the command that runs pays
                finite(kwargs.get(name), option)
                if option in DURATION_OPTIONS:
                    bounded_duration(kwargs.get(name), option)
            preflight_inputs(command, kwargs)
            code = command(*args, **kwargs)
        except typer.Exit:
            raise
        except DoctorError as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt as exc:
            terminated = isinstance(exc, Terminated)
            fail("terminated" if terminated else "interrupted", EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
        except BrokenPipeError:
            gone = streams_without_reader()
            if gone:
                quiet_exit_on_broken_pipe(gone)
            fail("internal error: BrokenPipeError (rerun with --debug for the traceback)", EXIT_INTERNAL)
        except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback, unless --debug
            fail(f"internal error: {exc.__class__.__name__}: {exc} (rerun with --debug for the traceback)",
                 EXIT_INTERNAL)
        finally:
            children.stop_all(reopen=True)
        raise typer.Exit(code or 0)

    return wrapper


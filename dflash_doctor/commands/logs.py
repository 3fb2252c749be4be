"""`dflash-doctor logs FILE|-`: stream a training log in constant memory; thread deaths, known errors, stalls."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dflash_doctor.commands.common import (
    EXIT_CODES_HELP,
    FAIL_ON_OPTION,
    FORMAT_OPTION,
    OUTPUT_OPTION,
    check_output,
    finish,
    guarded,
)
from dflash_doctor.errors import UsageError
from dflash_doctor.findings import FailOn
from dflash_doctor.render import OutputFormat

EPILOG = (
    "Examples:  dflash-doctor logs train.log  ·  ssh gpu-box cat /workspace/train.log | dflash-doctor logs -  ·  "
    "dflash-doctor logs train.log --follow --max-seconds 600  ·  "
    "dflash-doctor logs train.log --thread-pattern '\\[(\\w+-\\d+)\\]' --format json  ·  " + EXIT_CODES_HELP
)


def log_options(thread_pattern, baseline_window, sustain, drop, stall_steps):
    from dflash_doctor.logs.scan import LogOptions, compile_thread_pattern

    compile_thread_pattern(thread_pattern)  # a bad regex is a usage error before any reading
    if not 0 < drop < 1:
        raise UsageError("--drop must be a fraction in (0, 1), e.g. 0.3 for 30 % below the baseline")
    return LogOptions(thread_pattern=thread_pattern, baseline_window=baseline_window, sustain=sustain, drop=drop,
                      stall_steps=stall_steps)


def open_binary(path: str):
    import sys

    if path == "-":
        return sys.stdin.buffer
    try:
        return open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc


def scan_log(path: str, options, follow: bool = False, max_seconds: Optional[float] = None, on_findings=None):
    """The logs Report for `path` (`-`: stdin), read to its end or followed until `max_seconds` / Ctrl-C."""
    from dflash_doctor.logs.scan import follow_file, scan_stream

    if not follow:
        stream = open_binary(path)
        try:
            return scan_stream(stream, "<stdin>" if path == "-" else path, options)
        finally:
            if path != "-":
                stream.close()
    if path == "-":
        raise UsageError("--follow needs a file; a pipe is already read as it is written, until it closes")
    if not Path(path).is_file():
        raise UsageError(f"cannot follow {path}: not a file")
    import time

    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    return follow_file(path, options, should_stop=lambda: deadline is not None and time.monotonic() >= deadline,
                       on_findings=on_findings)


THREAD_PATTERN_OPTION = typer.Option(
    None, "--thread-pattern", help="Regex whose group 'thread' (or group 1) names a line's thread; default: "
    "thread=NAME, [rankN], or a NAME-N token like drafter-0.")


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def logs(
        path: str = typer.Argument(..., metavar="FILE|-", help="The training log, or - for stdin."),
        follow: bool = typer.Option(False, "--follow", "-F", help="Keep reading as the file grows, like tail -f "
                                    "(Ctrl-C or --max-seconds ends it and prints the report)."),
        max_seconds: Optional[float] = typer.Option(None, "--max-seconds", min=0.0,
                                                    help="Stop following after this many seconds."),
        thread_pattern: Optional[str] = THREAD_PATTERN_OPTION,
        baseline_window: int = typer.Option(10, "--baseline-window", min=2, help="DFD503: throughput samples in "
                                            "the rolling baseline."),
        sustain: int = typer.Option(5, "--sustain", min=1, help="DFD503: consecutive low samples that make a drop."),
        drop: float = typer.Option(0.3, "--drop", help="DFD503: fraction below the baseline that counts as low."),
        stall_steps: int = typer.Option(20, "--stall-steps", min=1, help="DFD507: steps another thread must "
                                        "advance while this one makes none."),
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Find dead threads and why they died (FX race, OOM, NCCL), dense-attention fallbacks, recompile limits,
        throughput drops and stalled threads, streaming the log line by line."""
        check_output(output, [path])
        import sys

        from dflash_doctor.render.logs_view import render_finding_live, render_logs
        from dflash_doctor.render.text import console_for

        options = log_options(thread_pattern, baseline_window, sustain, drop, stall_steps)
        live = console_for(sys.stderr)
        report = scan_log(path, options, follow, max_seconds,
                          on_findings=lambda found: [render_finding_live(live, f) for f in found])
        return finish(report, fmt, fail_on, output, facts_view=render_logs)

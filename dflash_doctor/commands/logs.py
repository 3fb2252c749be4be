"""`dflash-doctor logs FILE|-`: stream a training log in constant memory; deaths, their causes, slowdowns, hangs."""
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
    finite,
    guarded,
)
from dflash_doctor.findings import FailOn
from dflash_doctor.logs.options import DEFAULTS, THREAD_PATTERN_HELP
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.help import epilog

EPILOG = epilog(
    ["dflash-doctor logs train.log", "ssh gpu-box cat /workspace/train.log | dflash-doctor logs -",
     "dflash-doctor logs train.log.gz", "dflash-doctor logs train.log --follow --max-seconds 600",
     "dflash-doctor logs train.log --thread-pattern '\\[(\\w+-\\d+)\\]' --format json"],
    "Only regular files (plain, gzip, bzip2, xz) and - are read.",
    EXIT_CODES_HELP,
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def logs(
        path: str = typer.Argument(..., metavar="FILE|-", help="The training log, or - for stdin."),
        follow: bool = typer.Option(False, "--follow", "-F", help="Keep reading as the file grows, like tail -F "
                                    "(rotation and truncation included; Ctrl-C or --max-seconds ends it and "
                                    "prints the report)."),
        max_seconds: Optional[float] = typer.Option(None, "--max-seconds", help="Stop following after this many "
                                                    "seconds."),
        thread_pattern: Optional[str] = typer.Option(None, "--thread-pattern", help=THREAD_PATTERN_HELP),
        baseline_window: int = typer.Option(DEFAULTS.baseline_window, "--baseline-window", min=2,
                                            help="DFD503: throughput samples in the rolling baseline."),
        sustain: int = typer.Option(DEFAULTS.sustain, "--sustain", min=1, help="DFD503: consecutive low samples "
                                    "that make a drop."),
        drop: float = typer.Option(DEFAULTS.drop, "--drop", help="DFD503: fraction below the baseline that counts "
                                   "as low, in (0, 1)."),
        stall_steps: int = typer.Option(DEFAULTS.stall_steps, "--stall-steps", min=1, help="DFD507: steps another "
                                        "thread must advance while this one makes none."),
        tokens_per_it: Optional[float] = typer.Option(None, "--tokens-per-it", help="Tokens per iteration, to read "
                                                      "it/s (tqdm, Megatron) as tok/s."),
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Find dead workers (threads, main thread, ranks, signals) and why they died (FX race, OOM, Triton
        resources, illegal memory access, NCCL), hangs in stack dumps, recompile limits, dense-attention
        fallbacks, throughput drops and stalled threads, streaming the log."""
        check_output(output, [path])
        import sys

        from dflash_doctor.logs.options import make_options
        from dflash_doctor.logs.source import scan_log
        from dflash_doctor.render.logs_view import render_finding_live, render_logs
        from dflash_doctor.render.text import console_for

        finite(max_seconds, "--max-seconds", minimum=0.0)
        finite(drop, "--drop", minimum=0.0, maximum=1.0, inclusive_minimum=False)
        finite(tokens_per_it, "--tokens-per-it", minimum=0.0, inclusive_minimum=False)
        options = make_options(thread_pattern, baseline_window, sustain, drop, stall_steps, tokens_per_it)
        live = console_for(sys.stderr)

        def show_live(found) -> None:
            for finding in found:
                render_finding_live(live, finding)

        report = scan_log(path, options, follow, max_seconds, on_findings=show_live)
        return finish(report, fmt, fail_on, output, facts_view=render_logs)

"""`dflash-doctor status --log FILE [--from CSV]`: one screen joining the log and the GPUs of a sick run."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

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
from dflash_doctor.logs.options import THREAD_PATTERN_HELP
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.help import epilog

EPILOG = epilog(
    ["dflash-doctor status --log train.log --from smi.csv --roles target=0-4,drafter=5-7",
     "dflash-doctor status --log train.log --roles target=0-4,drafter=5-7 --map drafter-0=5"],
    "Worker -> GPU: --map NAME=GPU, else ROLE-N runs on the N-th GPU of ROLE as --roles lists them, and rankN on "
    "GPU N when no role says otherwise.",
    EXIT_CODES_HELP,
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def status(
        log: str = typer.Option(..., "--log", metavar="FILE|-", help="The training log, or - for stdin."),
        source: Optional[str] = typer.Option(None, "--from", metavar="FILE|-", help="nvidia-smi CSV snapshot; "
                                             "without it NVML is sampled live."),
        columns: Optional[str] = typer.Option(None, "--columns", help="Field names of a headerless CSV."),
        roles: Optional[str] = typer.Option(None, "--roles", help="GPU roles: target=0-4,drafter=5-7."),
        thread_map: Optional[List[str]] = typer.Option(None, "--map", help="THREAD=GPU, e.g. drafter-0=5 "
                                                       "(repeatable or comma-separated)."),
        memory_total: Optional[str] = typer.Option(None, "--memory-total", help="GPU memory capacity when the "
                                                   "snapshot lacks memory.total (MiB or with unit)."),
        samples: int = typer.Option(5, "--samples", "-n", min=1, help="Live NVML samples to average."),
        interval: float = typer.Option(0.5, "--interval", "-i", help="Seconds between live samples."),
        thread_pattern: Optional[str] = typer.Option(None, "--thread-pattern", help=THREAD_PATTERN_HELP),
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Which worker died, what killed it, which GPU it left idle, what the others do, and what to try next."""
        check_output(output, [log, source])
        from dflash_doctor.gpus.csv_snapshot import parse_columns, parse_memory_total
        from dflash_doctor.gpus.roles import parse_roles, parse_thread_map
        from dflash_doctor.render.status_view import render_status
        from dflash_doctor.status.run import status_report

        finite(interval, "--interval", minimum=0.0)
        report = status_report(log, source=source, columns=parse_columns(columns) if columns else None,
                               roles=parse_roles(roles), thread_map=parse_thread_map(thread_map or []),
                               memory_total_mib=parse_memory_total(memory_total), samples=samples,
                               interval=interval, thread_pattern=thread_pattern)
        return finish(report, fmt, fail_on, output, facts_view=render_status)

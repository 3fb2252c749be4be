"""`dflash-doctor gpus`: live NVML samples or an nvidia-smi CSV, compared per role (DFD4xx)."""
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
from dflash_doctor.errors import UsageError
from dflash_doctor.findings import FailOn
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.help import epilog

EPILOG = epilog(
    ["dflash-doctor gpus --roles target=0-4,drafter=5-7",
     "nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader | "
     "dflash-doctor gpus --from - --roles target=0-4,drafter=5-7 --memory-total 97871",
     "dflash-doctor gpus --watch --interval 1"],
    EXIT_CODES_HELP,
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def gpus(
        source: Optional[str] = typer.Option(
            None, "--from", metavar="FILE|-",
            help="Read nvidia-smi --query-gpu CSV (with or without header) instead of sampling NVML live."),
        columns: Optional[str] = typer.Option(
            None, "--columns", help="Field names of a headerless CSV, e.g. index,memory.used,memory.total,"
            "utilization.gpu (default for 3 fields: index,memory.used,utilization.gpu)."),
        roles: Optional[str] = typer.Option(
            None, "--roles", help="GPU roles: target=0-4,drafter=5-7 (ranges and lists). Without it every GPU is a "
            "peer of every other."),
        memory_total: Optional[str] = typer.Option(
            None, "--memory-total", help="GPU memory capacity when the source lacks memory.total: 97871 (MiB), "
            "96GiB, 141GB."),
        samples: Optional[int] = typer.Option(
            None, "--samples", "-n", min=1, help="Live samples to average (default 5; --watch: until Ctrl-C)."),
        interval: float = typer.Option(0.5, "--interval", "-i", help="Seconds between live samples."),
        watch: bool = typer.Option(False, "--watch", "-w", help="Refresh the table after every live sample."),
        idle_util: float = typer.Option(3.0, "--idle-util", help="Utilization % at or below which a GPU is idle."),
        min_held: str = typer.Option("2048", "--min-held", help="Memory an idle GPU must hold for DFD401 (MiB or "
                                     "with unit)."),
        imbalance_gap: float = typer.Option(40.0, "--imbalance-gap", help="DFD402: points below the role's busy "
                                            "level."),
        imbalance_ratio: float = typer.Option(0.5, "--imbalance-ratio", help="DFD402: and at most this fraction "
                                              "of it."),
        near_capacity: float = typer.Option(95.0, "--near-capacity", help="DFD403: memory.used % of memory.total."),
        busy_util: float = typer.Option(30.0, "--busy-util", help="DFD405: utilization % above which a peer "
                                        "holding memory counts as busy."),
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Compare every GPU with its role peers: idle GPUs holding memory, starved peers, memory near capacity."""
        check_output(output, [source])
        from dflash_doctor.gpus.analyze import make_thresholds
        from dflash_doctor.gpus.csv_snapshot import parse_columns, parse_memory_total
        from dflash_doctor.gpus.roles import parse_roles
        from dflash_doctor.render.gpus_view import render_gpus

        for option, value in (("--idle-util", idle_util), ("--imbalance-gap", imbalance_gap),
                              ("--near-capacity", near_capacity), ("--busy-util", busy_util)):
            finite(value, option, minimum=0.0, maximum=100.0)
        finite(imbalance_ratio, "--imbalance-ratio", minimum=0.0, maximum=1.0, inclusive_minimum=False)
        finite(interval, "--interval", minimum=0.0)
        role_map = parse_roles(roles)
        total = parse_memory_total(memory_total)
        thresholds = make_thresholds(idle_util, min_held, imbalance_gap, imbalance_ratio, near_capacity, busy_util)
        if source is not None:
            if watch or samples is not None:
                raise UsageError("--watch and --samples sample NVML live; they do not apply to --from")
            from dflash_doctor.gpus.sources import report_from_csv_input

            report = report_from_csv_input(source, columns=parse_columns(columns) if columns else None,
                                           roles=role_map, thresholds=thresholds, memory_total_mib=total)
        else:
            report = live_report(samples, interval, watch, fmt, role_map, thresholds, total)
        return finish(report, fmt, fail_on, output, facts_view=render_gpus)


def live_report(samples, interval, watch, fmt, role_map, thresholds, total, open_devices=None, sleep=None,
                console=None):
    """Sample NVML; with `watch`, redraw the table after each sample (rich Live) until `samples` or Ctrl-C."""
    import sys
    import time

    from dflash_doctor.gpus.nvml import PynvmlDevices
    from dflash_doctor.gpus.sources import report_from_nvml

    open_devices = open_devices or PynvmlDevices.open
    sleep = sleep or time.sleep
    if not watch:
        return report_from_nvml(samples=samples or 5, interval=interval, sleep=sleep, roles=role_map,
                                thresholds=thresholds, memory_total_mib=total, open_devices=open_devices)
    from rich.live import Live

    from dflash_doctor.render.gpus_view import gpus_table
    from dflash_doctor.render.text import console_for

    # The refreshing table goes to stdout only for the text format, so JSON/SARIF on stdout stay parseable.
    console = console or console_for(sys.stdout if fmt is OutputFormat.TEXT else sys.stderr)
    with Live(console=console, auto_refresh=False, transient=True) as live:
        def redraw(report) -> None:
            live.update(gpus_table(console, report.facts), refresh=True)

        return report_from_nvml(samples=samples, interval=interval, sleep=sleep, roles=role_map,
                                thresholds=thresholds, memory_total_mib=total, on_sample=redraw,
                                open_devices=open_devices)

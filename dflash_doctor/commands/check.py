"""`dflash-doctor check [PATH...]`: the CI pre-flight (scan + guards, optionally a quick forced repro)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from dflash_doctor.commands.common import (
    EXIT_CODES_HELP,
    FAIL_ON_OPTION,
    FORMAT_OPTION,
    OUTPUT_OPTION,
    QUIET_OPTION,
    check_output,
    finish,
    guarded,
)
from dflash_doctor.findings import FailOn
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.help import epilog

EPILOG = epilog(
    ["dflash-doctor check", "dflash-doctor check src/ --format sarif --output dflash-doctor.sarif",
     "dflash-doctor check src/ --format junit -o dflash-doctor.xml", "dflash-doctor check --repro --fail-on error",
     "dflash-doctor check --no-probes --fail-on never"],
    EXIT_CODES_HELP + " A missing torch is exit 4 (the guards could not be checked) with the scan's result still in "
    "the report.",
    "Guards and repro findings are downgraded to info when the scan finds no compiled call in a thread (DFD201); "
    "--assume-threads keeps them.",
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def check(
        paths: Optional[List[Path]] = typer.Argument(
            None, help="Files or folders to scan (default: the current folder).", show_default=False
        ),
        exclude: Optional[List[str]] = typer.Option(
            None, "--exclude", help="Glob of paths the scan skips (repeatable).", show_default=False
        ),
        probes: bool = typer.Option(
            True, "--probes/--no-probes", help="Run the guards' live probes in child processes (needs torch)."
        ),
        repro: bool = typer.Option(False, "--repro", help="Also run a quick forced repro on the CPU (needs torch)."),
        timeout: float = typer.Option(
            120.0, "--timeout", min=1.0, help="Seconds allowed to the guards' probes and to each repro phase."),
        assume_threads: bool = typer.Option(
            False, "--assume-threads",
            help="Keep guards/repro findings at full severity even if the scan finds no compiled call in a thread "
                 "(DFD201), e.g. when the threads start outside the scanned paths.",
        ),
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
        quiet: bool = QUIET_OPTION,
    ) -> int:
        """CI pre-flight: scan the code and check the installed PyTorch's guards in one report (SARIF, JUnit...)."""
        check_output(output, paths or [Path(".")], read_suffixes=(".py",))
        from dflash_doctor.check import CheckPlan, run_check
        from dflash_doctor.render.check_view import render_check

        plan = CheckPlan(
            paths=tuple(str(p) for p in paths) if paths else (".",),
            exclude=tuple(exclude or ()),
            probes=probes,
            repro=repro,
            timeout=timeout,
            assume_threads=assume_threads,
        )
        from dflash_doctor.render.progress_view import reporting

        with reporting("check", quiet=quiet) as progress:
            report = run_check(plan, progress=progress)
        return finish(report, fmt, fail_on, output, facts_view=render_check)

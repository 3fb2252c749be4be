"""`dflash-doctor scan PATH...`: static detection of the hazards behind torch.compile thread races."""
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
    guarded,
)
from dflash_doctor.findings import FailOn
from dflash_doctor.render import OutputFormat

EPILOG = (
    "Examples:  dflash-doctor scan src/  ·  dflash-doctor scan train.py --format json  ·  "
    "dflash-doctor scan . --exclude 'tests/*' --select DFD1 --format sarif -o scan.sarif  ·  "
    "dflash-doctor scan . --ignore DFD202 --fail-on error.  "
    "Silence one line with `# noqa: DFD102`.  " + EXIT_CODES_HELP
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def scan(
        paths: List[Path] = typer.Argument(..., help="Files or folders to scan (folders: every .py file below)."),
        exclude: List[str] = typer.Option(
            [], "--exclude", "-x", help="Glob of files or folders to skip (repeatable), e.g. 'tests/*'.",
        ),
        select: Optional[str] = typer.Option(
            None, "--select", help="Only these rules: codes, prefixes or names, comma-separated (DFD1,DFD201).",
        ),
        ignore: Optional[str] = typer.Option(None, "--ignore", help="Skip these rules (same syntax as --select)."),
        jobs: Optional[int] = typer.Option(
            None, "--jobs", "-j", help="Worker processes for large trees (default: one per CPU core).",
        ),
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Find gradient checkpointing that runs reentrant, compiled calls from threads, uncompiled
        flex_attention and a silenced nested-FX-trace error. Pure AST: never imports torch or your code."""
        check_output(output, paths, read_suffixes=(".py",))
        from dflash_doctor.scan import scan_paths

        report = scan_paths([str(p) for p in paths], exclude=exclude, jobs=jobs, select=select, ignore=ignore)
        return finish(report, fmt, fail_on, output)

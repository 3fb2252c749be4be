"""`dflash-doctor guards`: is compiled code safe to call from several threads with the installed torch?"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dflash_doctor.commands.common import (
    EXIT_CODES_HELP, FAIL_ON_OPTION, FORMAT_OPTION, OUTPUT_OPTION, QUIET_OPTION, check_output, finish, finite, guarded,
)
from dflash_doctor.findings import FailOn
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.help import epilog

EPILOG = epilog(
    ["dflash-doctor guards", "dflash-doctor guards --no-probes", "dflash-doctor guards --format json | jq .facts.verdict",
     "dflash-doctor guards --format sarif -o guards.sarif",
     "dflash-doctor guards --torch-root ./unpacked-wheel/torch --no-probes"],
    EXIT_CODES_HELP,
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def guards(
        probes: bool = typer.Option(
            True, "--probes/--no-probes",
            help="Run the three live probes (each in its own child process); --no-probes reads the source only.",
        ),
        timeout: float = typer.Option(
            30.0, "--timeout", min=1.0,
            help="Seconds the probes may take in all (one torch import, then the probes side by side); a probe "
                 "still running then is killed and reported as an error.",
        ),
        torch_root: Optional[Path] = typer.Option(
            None, "--torch-root", file_okay=False,
            help="Read another torch source tree (e.g. an unpacked wheel) instead of the installed one; "
                 "sources only: no probes, and nothing about this host (caches, environment) is reported.",
        ),
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
        quiet: bool = QUIET_OPTION,
    ) -> int:
        """Read the installed PyTorch's compile guard, FX-tracing flag and backward compile, probe them live, and give
        a verdict per hazard (FX-flag leak, stuck flag, is-compiling leak, compile-lock deadlock) with fixes
        ranked for that release."""
        check_output(output)
        from dflash_doctor.guards import run_guards
        from dflash_doctor.render.guards_view import guards_view

        finite(timeout, "--timeout", minimum=1.0)
        from dflash_doctor.render.progress_view import reporting

        with reporting("guards", quiet=quiet) as progress:
            report = run_guards(probes=probes, timeout=timeout, torch_root=torch_root, progress=progress)
        return finish(report, fmt, fail_on, output, facts_view=guards_view)

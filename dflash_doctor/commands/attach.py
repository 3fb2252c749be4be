"""`dflash-doctor attach PID`: read every thread of a live (hung) process with py-spy and name the cycle."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dflash_doctor.commands.common import FORMAT_OPTION, OUTPUT_OPTION, check_output, finish, guarded
from dflash_doctor.errors import finite
from dflash_doctor.render import OutputFormat

EPILOG = (
    "For a run that was not started under `dflash-doctor run`. Needs py-spy (pip install py-spy) "
    "and ptrace rights over PID (same user; kernel.yama.ptrace_scope 0 or root; --cap-add SYS_PTRACE in a "
    "container). Exit codes: 0 no cycle; 1 a deadlock named; 2 usage error (no such PID); 4 could not read it "
    "(py-spy missing, ptrace not permitted).\n\n"
    "\b\nExamples:\n"
    "  dflash-doctor attach 4242\n"
    "  dflash-doctor attach 4242 --subprocesses --samples 3 --interval 2 -f json -o attach.json"
)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def attach(
        pid: int = typer.Argument(..., help="The process to read (a torchrun launcher with --subprocesses)."),
        subprocesses: bool = typer.Option(False, "--subprocesses", help="Also read the process's children."),
        samples: int = typer.Option(2, "--samples", min=2, max=20,
                                    help="Dumps taken; a cycle counts only if its threads stand still in all."),
        interval: float = typer.Option(1.0, "--interval", help="Seconds between dumps."),
        fmt: OutputFormat = FORMAT_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Dump every thread of PID (and its children) a few times with py-spy, see which threads do not move,
        name the compile_lock / autograd cycle or a lock-order cycle, the GPU each process holds, and the fix."""
        finite(interval, "--interval", minimum=0.0, maximum=600.0)
        check_output(output)
        from dflash_doctor.supervise.attach import AttachSpec, attach as read_process

        from dflash_doctor.render.live_view import render_attach_facts

        report = read_process(AttachSpec(pid, subprocesses, samples, interval))
        return finish(report, fmt, output=output, facts_view=render_attach_facts)

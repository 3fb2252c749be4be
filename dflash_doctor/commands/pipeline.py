"""`dflash-doctor pipeline`: train the bundled reference DFlash drafter with target and drafter workers."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from dflash_doctor.commands.common import FAIL_ON_OPTION, FORMAT_OPTION, OUTPUT_OPTION, check_output, finish, guarded
from dflash_doctor.findings import FailOn
from dflash_doctor.render import OutputFormat

EPILOG = (
    "Examples:  dflash-doctor pipeline --preset tiny --device cpu --steps 30  ·  "
    "dflash-doctor pipeline --preset small --device cuda --workers processes  ·  "
    "dflash-doctor pipeline --preset seeds --device cuda --target-devices 0,1,2,3,4 --drafter-devices 5,6,7  ·  "
    "dflash-doctor pipeline --save runs/d1 && dflash-doctor pipeline --save runs/d1 --resume  ·  "
    "dflash-doctor pipeline --fail-worker drafter-1 --fail-at-step 3 --format json   "
    "Exit codes: 0 the run finished; 1 a worker died or hung (named on stdout and in JSON `failed_worker`; the "
    "others were shut down cleanly); 2 usage error; 3 internal error; 4 a missing dependency (transformers)."
)


def _current_stderr_handler():
    """A log handler writing to whatever sys.stderr is at emit time, so log lines go above rich's progress bar,
    not through it. logging is imported here, not at the top: `--help` and `scan` must not pay for it."""
    import logging

    class _CurrentStderrHandler(logging.StreamHandler):
        def emit(self, record):
            self.stream = sys.stderr
            super().emit(record)

    return _CurrentStderrHandler(sys.stderr)


def _progress_bar(enabled: bool):
    """A rich progress bar on stderr when it is a terminal, else None (the step log lines are enough)."""
    if not enabled or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                    TimeRemainingColumn(), console=Console(file=sys.stderr), redirect_stderr=True, transient=True)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def pipeline(
        preset: str = typer.Option("tiny", "--preset", help="tiny (CPU, seconds) | small (one GPU) | seeds (5+3)."),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
        workers: str = typer.Option("threads", "--workers", help="threads (the seeds' design) or processes "
                                    "(torch.distributed; also launchable by torchrun)."),
        steps: Optional[int] = typer.Option(None, "--steps", help="Drafter steps to run (default: the preset's)."),
        checkpoint: str = typer.Option("none", "--checkpoint",
                                       help="Loss chunks under torch.utils.checkpoint: reentrant | non-reentrant | "
                                       "none."),
        target_devices: Optional[str] = typer.Option(None, "--target-devices",
                                                     help="Comma list, one target worker each (e.g. 0,1,2)."),
        drafter_devices: Optional[str] = typer.Option(None, "--drafter-devices",
                                                      help="Comma list, one drafter worker each (e.g. 3,4)."),
        save: Optional[Path] = typer.Option(None, "--save", file_okay=False,
                                            help="Save the drafter to DIR/drafter.pt (atomically) at the end."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint in --save DIR."),
        seed: int = typer.Option(0, "--seed", help="Seed for weights, data and anchors."),
        target_checkpoint: Optional[Path] = typer.Option(
            None, "--target-checkpoint", file_okay=False,
            help="A local Hugging Face checkpoint folder for the target (needs transformers; never downloads)."),
        fail_worker: Optional[str] = typer.Option(
            None, "--fail-worker", help="For testing the shutdown: kill this worker (e.g. drafter-1) ..."),
        fail_at_step: int = typer.Option(1, "--fail-at-step", help="... at its Nth step of this run."),
        stall_timeout: float = typer.Option(
            600.0, "--stall-timeout", help="Seconds without a drafter step (the first includes compiling) before "
            "the run is declared hung and stopped: a deadlocked compile never returns."),
        # Annotated like every other command: unannotated, typer 0.27 on Python 3.12 passed the default as the
        # string 'FailOn.WARNING' (seen on the H200), which no enum accepts.
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Train the reference DFlash drafter: frozen target workers feed drafter workers; prints tok/s, loss and
        every worker's health."""
        check_output(output)
        import logging

        from dflash_doctor.errors import UsageError, require_torch
        from dflash_doctor.findings import Report
        from dflash_doctor.render.pipeline_view import render_pipeline

        require_torch("the reference pipeline")
        from dflash_doctor.reference.pipeline import PipelineOptions, make_plan, run_plan

        options = PipelineOptions(
            preset=preset, device=device, workers=workers, steps=steps, checkpoint=checkpoint,
            target_devices=target_devices, drafter_devices=drafter_devices,
            save_dir=str(save) if save else None, resume=resume, seed=seed, fail_worker=fail_worker,
            fail_at_step=fail_at_step, hf_checkpoint=str(target_checkpoint) if target_checkpoint else None,
            stall_timeout_s=stall_timeout,
        )
        try:
            plan = make_plan(options)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc

        logger = logging.getLogger("dflash_doctor.reference")
        handler = _current_stderr_handler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        bar = _progress_bar(OutputFormat(fmt) is OutputFormat.TEXT and output is None)
        try:
            if bar is None:
                result = run_plan(plan, workers)
            else:
                with bar:
                    task = bar.add_task("train", total=plan.steps, info="")

                    def progress(done, total, loss, tokens_per_s):
                        rate = f" {tokens_per_s:,.0f} tok/s" if tokens_per_s else ""
                        bar.update(task, completed=done, info=f"loss {loss:.4f}{rate}")

                    result = run_plan(plan, workers, progress)
        finally:
            logger.removeHandler(handler)

        report = Report("pipeline", facts=result.facts())
        if not result.ok:
            report.exit_code_override = 1
        code = finish(report, fmt, fail_on, output, facts_view=render_pipeline)
        if workers == "threads" and any(w.outcome == "hung" for w in result.workers):
            # A deadlocked thread can never be joined, and interpreter shutdown with it inside torch can abort:
            # the report is written, so leave now with its exit code.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code

"""`dflash-doctor pipeline`: train the bundled reference DFlash drafter with target and drafter workers."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from dflash_doctor import mitigations
from dflash_doctor.commands.common import (
    FAIL_ON_OPTION, FORMAT_OPTION, OUTPUT_OPTION, check_output, finish, finite, guarded,
)
from dflash_doctor.findings import FailOn
from dflash_doctor.inputs import SAVE_FOLDER, SOURCE_FOLDER, input_option
from dflash_doctor.vocabularies import Checkpoint, FailHow, Transport
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.help import epilog

if TYPE_CHECKING:
    from dflash_doctor.reference.facts import PipelineFacts

EPILOG = epilog(
    ["dflash-doctor pipeline --preset tiny --device cpu --steps 30",
     "dflash-doctor pipeline --preset seeds --device cuda --steps 20 --stall-timeout 60",
     "dflash-doctor pipeline --preset seeds --device cuda --steps 20 --mitigation threadlocal-flag,non-lazy-backward",
     "dflash-doctor pipeline --preset small --device cuda --workers processes",
     "dflash-doctor pipeline --tracing-thread --mitigation isolate-fx-patches",
     "dflash-doctor pipeline --preset seeds --device cuda --target-devices 0,1,2,3,4 --drafter-devices 5,6,7",
     "dflash-doctor pipeline --save runs/d1 && dflash-doctor pipeline --save runs/d1 --resume",
     "dflash-doctor pipeline --fail-worker drafter-1 --fail-at-step 3 --format json"],
    "Exit codes: 0 the run finished; 1 a worker died or hung (a DFD8xx finding names it, its cause and its "
    "stacks; the other workers were shut down); 2 usage error; 3 internal error; 4 a missing dependency, or a "
    "mitigation this torch cannot apply; 130 / 143 stopped by SIGINT / SIGTERM (the partial report is written)."
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


def _progress_view(enabled: bool):
    """A rich progress display on stderr when it is a terminal (set-up phases, then steps), else None: the log
    lines say the same."""
    if not enabled or not sys.stderr.isatty():
        return None
    from dflash_doctor.render.pipeline_view import LiveProgress

    return LiveProgress()


def _threads_left(result) -> bool:
    """Worker (or set-up) threads still running after the run: stuck inside torch, or interrupted mid-step."""
    import threading

    names = {w.name for w in result.workers} | {"set-up"}
    return any(t.is_alive() and t.name in names for t in threading.enumerate())


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def pipeline(
        preset: str = typer.Option("tiny", "--preset", help="tiny (CPU, seconds) | small (one GPU) | seeds (5+3)."),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
        workers: Optional[str] = typer.Option(
            None, "--workers", help="threads (the seeds' design; the default) or processes (torch.distributed; "
            "also launchable by torchrun)."),
        mitigation: str = typer.Option("none", "--mitigation", help="Fixes applied in set-up: " +
                                       mitigations.help_text()),
        steps: Optional[int] = typer.Option(None, "--steps", help="Drafter steps to run (default: the preset's)."),
        batch_size: Optional[int] = typer.Option(None, "--batch-size",
                                                 help="Sequences per drafter step (default: the preset's)."),
        compile_dense: Optional[bool] = typer.Option(
            None, "--compile-dense/--no-compile-dense",
            help="Compile the drafter's norms, projections, MLP and loss chunks whole, flex_attention still its own "
            "compiled call (default: on for small, off for the presets that reproduce the incident)."),
        checkpoint: Checkpoint = typer.Option(Checkpoint.NONE, "--checkpoint",
                                              help="Loss chunks under torch.utils.checkpoint."),
        target_devices: Optional[str] = typer.Option(None, "--target-devices",
                                                     help="Comma list, one target worker each (e.g. 0,1,2)."),
        drafter_devices: Optional[str] = typer.Option(None, "--drafter-devices",
                                                      help="Comma list, one drafter worker each (e.g. 3,4)."),
        transport: Transport = typer.Option(
            Transport.AUTO, "--transport", case_sensitive=False,
            help="--workers processes: how batches go from target to drafter. auto: CUDA IPC (shared memory on a "
            "CPU) between workers on one device, NCCL between GPUs, gloo on a CPU; ipc or p2p to force one."),
        save: Optional[Path] = input_option(SAVE_FOLDER, None, "--save", file_okay=False,
                                            help="Save the drafter to DIR/drafter.pt (atomically) at the end."),
        resume: bool = typer.Option(False, "--resume", help="Continue from the checkpoint in --save DIR."),
        seed: int = typer.Option(0, "--seed", help="Seed for weights, data and anchors (0 .. 2^63-1)."),
        target_checkpoint: Optional[Path] = input_option(
            SOURCE_FOLDER, None, "--target-checkpoint", file_okay=False,
            help="A local Hugging Face checkpoint folder for the target (needs transformers; never downloads)."),
        fail_worker: Optional[str] = typer.Option(
            None, "--fail-worker", help="For testing the shutdown and the findings: fail this worker (e.g. "
            "drafter-1) ..."),
        fail_at_step: int = typer.Option(1, "--fail-at-step", help="... at its Nth step of this run (N >= 1) ..."),
        fail_how: FailHow = typer.Option(FailHow.KILL, "--fail-how", case_sensitive=False,
                                         help="... by being killed, raising an error, or deadlocking (hang)."),
        tracing_thread: bool = typer.Option(
            False, "--tracing-thread", help="Run a thread that loops torch.fx.symbolic_trace beside the workers, as "
            "trainers that profile or inspect graphs do (the FX patcher race; --mitigation isolate-fx-patches)."),
        stall_timeout: float = typer.Option(
            600.0, "--stall-timeout", help="Seconds with no drafter step, no compile event and no CPU use, after "
            "set-up, before the run is declared hung: the stacks are dumped, the cycle named, the run stopped."),
        # Annotated like every other command: unannotated, typer 0.27 on Python 3.12 passed the default as the
        # string 'FailOn.WARNING' (seen on the H200), which no enum accepts.
        fmt: OutputFormat = FORMAT_OPTION,
        fail_on: FailOn = FAIL_ON_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Train the reference DFlash drafter: frozen target workers feed drafter workers; prints tok/s, MFU, loss,
        every worker's health, and a finding for any worker that died or hung."""
        check_output(output)
        import logging

        from dflash_doctor.errors import UsageError, require_torch
        from dflash_doctor.findings import Report
        from dflash_doctor.render.pipeline_view import render_pipeline

        finite(stall_timeout, "--stall-timeout", minimum=0.0, inclusive_minimum=False)
        from dflash_doctor.reference.pipeline import (
            PipelineOptions,
            check_options,
            make_plan,
            resolve_mitigations,
            run_plan,
        )
        from dflash_doctor.reference.signals import StopRequest, exit_code_for
        from dflash_doctor.runtime import MitigationUnavailable

        options = PipelineOptions(
            preset=preset, device=device, workers=workers, steps=steps, checkpoint=Checkpoint(checkpoint).value,
            target_devices=target_devices, drafter_devices=drafter_devices,
            save_dir=str(save) if save else None, resume=resume, seed=seed, fail_worker=fail_worker,
            fail_at_step=fail_at_step, fail_how=FailHow(fail_how).value,
            hf_checkpoint=str(target_checkpoint) if target_checkpoint else None, stall_timeout_s=stall_timeout,
            mitigation=mitigation, transport=Transport(transport).value, batch_size=batch_size,
            compile_dense=compile_dense, tracing_thread=tracing_thread,
        )
        try:
            check_options(options)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        require_torch("the reference pipeline")
        from dflash_doctor.reference.findings import findings_from_facts, problems_from_facts

        try:
            plan = make_plan(options)
            mode = resolve_mitigations(options)[1]
        except ValueError as exc:
            raise UsageError(str(exc)) from exc

        logger = logging.getLogger("dflash_doctor.reference")
        handler = _current_stderr_handler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        view = _progress_view(OutputFormat(fmt) is OutputFormat.TEXT and output is None)
        stop = StopRequest()
        try:
            if view is None:
                result = run_plan(plan, mode, stop=stop)
            else:
                with view.running(plan.steps):
                    result = run_plan(plan, mode, view, stop=stop)
        except (mitigations.MitigationFailed, MitigationUnavailable) as exc:
            from dflash_doctor.errors import MissingDependency

            raise MissingDependency(f"--mitigation {mitigation}: {exc}") from exc
        finally:
            logger.removeHandler(handler)

        facts = result.facts()
        report: Report[PipelineFacts] = Report("pipeline", findings=findings_from_facts(facts), facts=facts,
                                               problems=problems_from_facts(facts, options.save_dir))
        if result.interrupted:
            report.exit_code_override = exit_code_for(result.interrupted)
        elif not result.ok:
            report.exit_code_override = 1
        code = finish(report, fmt, fail_on, output, facts_view=render_pipeline)
        if result.interrupted:
            from dflash_doctor.render.pipeline_view import stopped_summary

            sys.stderr.write(f"dflash-doctor: {stopped_summary(facts)}\n")
        if _threads_left(result) or result.interrupted:
            # A thread stuck inside torch can never be joined, and interpreter shutdown with it inside torch can
            # abort (exit 134); after a signal, the interpreter's final garbage collection of torch's state took
            # 4-5 s on the 2-core box, past the 5 s stop bound. The report is written: leave now with its code.
            from dflash_doctor import children

            children.stop_all()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code

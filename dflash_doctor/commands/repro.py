"""`dflash-doctor repro`: replay the drafter step in one thread, then in N, name the race and test the fixes."""
from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from dflash_doctor.commands.common import FORMAT_OPTION, OUTPUT_OPTION, check_output, finish, guarded, write_artifact
from dflash_doctor.render import OutputFormat

EPILOG = (
    "Examples:  dflash-doctor repro --threads 3 --device cpu --mode forced  ·  "
    "dflash-doctor repro --device cuda --mitigation threadlocal-flag,non-lazy-backward  ·  "
    "dflash-doctor repro --device cuda --matrix  ·  "
    "dflash-doctor repro --mode stuck --expect reproduced --format json  ·  "
    "dflash-doctor repro --model mypkg.drafter:build --trace trace.json.  "
    "Exit codes: 0 not reproduced; 1 reproduced (with --expect: 0 when the verdict matches, else 1); "
    "2 usage error; 3 harness failure (the single-thread control failed, or a mitigation could not be installed). "
    "--model imports and runs your code: the factory returns (module, input_builder(device, shape_index))."
)


class Mode(str, Enum):
    NATURAL = "natural"
    AMPLIFIED = "amplified"
    FORCED = "forced"
    STUCK = "stuck"


class Checkpoint(str, Enum):
    NONE = "none"
    REENTRANT = "reentrant"
    NON_REENTRANT = "non-reentrant"


class Shapes(str, Enum):
    SAME = "same"
    PER_THREAD = "per-thread"


class Cache(str, Enum):
    COLD = "cold"
    WARM = "warm"


class Expect(str, Enum):
    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not-reproduced"


def detect_device() -> str:
    """`cuda` when NVML sees a GPU, else `cpu`; NVML is cheap where importing torch in the parent is not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return "cuda" if pynvml.nvmlDeviceGetCount() > 0 else "cpu"
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU to replay on
        return "cpu"


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def repro(
        threads: int = typer.Option(3, "--threads", "-n", help="Worker threads in the multi-thread phase."),
        device: Optional[str] = typer.Option(
            None, "--device", help="cpu, cuda, or cuda:0,cuda:1,... (threads spread over them). Default: cuda if "
            "NVML sees a GPU, else cpu."),
        backward: Optional[bool] = typer.Option(
            None, "--backward/--no-backward",
            help="Train (forward+backward) or forward only. Default: on for CUDA, off on CPU, where flex_attention "
                 "has no backward."),
        checkpoint: Checkpoint = typer.Option(Checkpoint.NONE, "--checkpoint", help="Loss checkpointing variant."),
        shapes: Shapes = typer.Option(Shapes.SAME, "--shapes",
                                      help="same: every thread one shape; per-thread: each its own (more compiles)."),
        cache: Cache = typer.Option(Cache.COLD, "--cache",
                                    help="cold: a fresh TORCHINDUCTOR_CACHE_DIR per phase; warm: the current one."),
        steps: int = typer.Option(
            3, "--steps", help="Steps per thread; a thread done early keeps stepping while another is still in its "
            "first step (warm threads overlapping a compile, as in training), for at most --hang-after seconds."),
        trials: int = typer.Option(1, "--trials", help="Multi-thread trials, for a reproduction rate."),
        timeout: float = typer.Option(300.0, "--timeout", help="Seconds before a phase child is killed."),
        hang_after: float = typer.Option(60.0, "--hang-after",
                                         help="Seconds without progress before stacks are dumped and the run is "
                                              "called hung."),
        mode: Mode = typer.Option(Mode.NATURAL, "--mode",
                                  help="natural; amplified (sleep in FX proxy creation); forced (a thread holds the "
                                       "FX flag); stuck (two traces exit out of order)."),
        mitigation: str = typer.Option(
            "none", "--mitigation",
            help="none, first-call-lock, global-lock, warmup, threadlocal-flag, non-lazy-backward, processes; "
                 "combine with commas."),
        matrix: bool = typer.Option(
            False, "--matrix", help="Run every mitigation (one single-thread control, then each multi-thread run) "
            "and print mitigation, outcome, kind, steps/s; verdict and exit code stay those of --mitigation."),
        amplify_ms: float = typer.Option(2.0, "--amplify-ms", help="Sleep per FX proxy in amplified mode."),
        preset: str = typer.Option("tiny", "--preset", help="Reference drafter size."),
        model: Optional[str] = typer.Option(None, "--model",
                                            help="pkg.module:factory replaying your own model (runs your code)."),
        trace: Optional[Path] = typer.Option(None, "--trace", dir_okay=False,
                                             help="Write the timeline as Chrome trace JSON (open in Perfetto)."),
        expect: Optional[Expect] = typer.Option(None, "--expect",
                                                help="CI assertion: exit 0 when the verdict matches, else 1."),
        fmt: OutputFormat = FORMAT_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
    ) -> int:
        """Replay the drafter step single- then multi-threaded, each phase in its own process; name the race
        (FX-flag leak, stuck flag, deadlock), blame the thread that caused it, and test the mitigations."""
        check_output(output)
        check_output(trace, [output], "--trace")
        import sys

        from dflash_doctor.render.repro_view import render_repro_facts
        from dflash_doctor.render.text import console_for
        from dflash_doctor.repro.harness import EXIT_HARNESS_FAILURE, run_repro, trace_phases
        from dflash_doctor.repro.spec import ReproSpec, parse_devices, parse_mitigation

        spec = ReproSpec(
            threads=threads, devices=parse_devices(device or detect_device()), backward=backward,
            checkpoint=checkpoint.value, shapes=shapes.value, cache=cache.value, steps=steps, trials=trials,
            timeout_s=timeout, hang_after_s=hang_after, mode=mode.value, mitigation=parse_mitigation(mitigation),
            amplify_ms=amplify_ms, preset=preset, model=model,
        )
        err = console_for(sys.stderr)
        report = run_repro(spec, matrix=matrix, progress=lambda message: err.print(f"[dim]repro: {message}[/]"))
        if expect is not None and report.exit_code_override != EXIT_HARNESS_FAILURE:
            report.facts["expect"] = expect.value
            report.exit_code_override = 0 if report.facts.get("verdict") == expect.value else 1
        from dflash_doctor.runtime.chrome_trace import write_chrome_trace

        write_artifact(report, "--trace", trace, lambda path: write_chrome_trace(path, trace_phases(report.facts)))
        from dflash_doctor.report.last_repro import remember_repro

        remember_repro(report, report.exit_code())  # what `dflash-doctor report` bundles without re-running
        return finish(report, fmt, output=output, facts_view=render_repro_facts)

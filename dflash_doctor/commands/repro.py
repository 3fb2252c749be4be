"""`dflash-doctor repro`: replay the drafter step single- then multi-threaded, up the stress ladder; name the race
and put the fixes through the same ladder."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from dflash_doctor import mitigations as registry
from dflash_doctor.commands.common import (
    FORMAT_OPTION, OUTPUT_OPTION, QUIET_OPTION, check_output, finish, guarded, write_artifact,
)
from dflash_doctor.render import OutputFormat
from dflash_doctor.render.help import NO_REWRAP, epilog
from dflash_doctor.vocabularies import JOBS_DEFAULT_TEXT, Cache, Checkpoint, Expect, Mode, ModelCompile, Shapes

EPILOG = epilog(
    ["dflash-doctor repro --threads 3",
     "dflash-doctor repro --device cuda --mitigation threadlocal-flag,non-lazy-backward",
     "dflash-doctor repro --device cuda --matrix",
     "dflash-doctor repro --matrix --max-time 300     # at most five minutes, however loaded the machine",
     "dflash-doctor repro --mode forced --expect reproduced --format json",
     "dflash-doctor repro --mode dataparallel --threads 3 --device cuda",
     "dflash-doctor repro --model mypkg.drafter:build --trace trace.json",
     "dflash-doctor repro --model mypkg.drafter:build --model-compile yours --device cuda",
     "dflash-doctor repro --step mytrainer.replay:make_step --threads 3 --device cuda --mitigation threadlocal-flag"],
    "The default --mode auto climbs natural -> amplified -> forced until the race shows, skipping what this "
    "machine cannot show (said up front). A mitigation is 'holds' only after it survived its whole stress ladder "
    "against a baseline that reproduced under the same stresses; otherwise 'fails' or 'inconclusive'.",
    "Exit codes: 0 not reproduced; 1 reproduced (with --expect: 0 when the verdict matches, else 1); "
    "2 usage error (a --model that cannot be imported or built included); 3 harness failure (the single-thread "
    "control failed, a mitigation could not be applied, no trial gave a verdict, --max-time passed before "
    "one did); 4 torch is missing; 5 a --step/--model replay failed only under a stress that injects the tool's "
    "own FX trace (forced, stuck, foreign-trace) while its own threads did not race: verdict reproduced-if-traced, "
    "the step fails IF a thread of your trainer traces with FX while it runs.",
    "--model imports and runs your code: the factory returns (module, input_builder(device, shape_index)); "
    "repro wraps the module in torch.compile unless --model-compile yours. --step replays your training step as "
    "written (your compiles, your forward and backward): make_step(device, shape_index) is called in each worker's "
    "process after the mitigations are in place and returns a zero-argument callable, one step.",
    NO_REWRAP + """
A complete --step module, mytrainer/replay.py (a trainer that compiles only flex_attention):
  import torch
  from torch.nn.attention.flex_attention import flex_attention
  attend = torch.compile(flex_attention)           # your trainer's own compile
  def make_step(device, shape_index):
      w = torch.randn(256, 768, device=device, requires_grad=True)
      def step():
          x = torch.randn(1, 256 * (shape_index + 2), 256, device=device)
          q, k, v = (x @ w).view(1, -1, 3, 4, 64).permute(2, 0, 3, 1, 4)
          loss = attend(q, k, v).float().pow(2).mean()
          loss.backward()
          return loss
      return step""",
)


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


def check_torch(devices) -> None:
    """One line, before any child starts: no torch at all (exit 4), or CUDA asked of a CPU-only build (exit 2)."""
    from dflash_doctor.errors import MissingDependency, UsageError
    from dflash_doctor.guards.torch_sources import installed_torch_root, is_accelerator_build

    root = installed_torch_root()
    if root is None:
        raise MissingDependency("repro needs torch, which is not importable here; install the torch you want to "
                                "diagnose (pip install torch==2.13.0 for a CPU build); dflash-doctor never "
                                "installs it for you")
    if devices != ("cpu",) and not is_accelerator_build(root):
        raise UsageError(f"--device {','.join(devices)}: the installed torch ({root}) is a CPU-only build; use "
                         "--device cpu, or run where a CUDA build of torch is installed")


def _dataparallel(threads: int, devices, steps: int, timeout: float, mitigation: str, fmt: OutputFormat,
                  output: Optional[Path], quiet: bool, expect: Optional[Expect]) -> int:
    """`--mode dataparallel`: each nn.DataParallel form in a child of its own (repro/dataparallel.py)."""
    from dflash_doctor.errors import UsageError
    from dflash_doctor.render.dataparallel_view import render_dataparallel_facts
    from dflash_doctor.render.progress_view import reporting
    from dflash_doctor.repro.dataparallel import EXIT_HARNESS_FAILURE, DataParallelSpec, parse_fixes, run_dataparallel

    if len(devices) != 1 or not 2 <= threads <= 16 or not 1 <= steps <= 100:
        raise UsageError("--mode dataparallel takes one --device (its replicas repeat it), --threads 2..16 "
                         "replicas and --steps 1..100")
    check_torch(devices)
    spec = DataParallelSpec(replicas=threads, device=devices[0], steps=steps, fixes=parse_fixes(mitigation),
                            timeout_s=timeout)
    with reporting("repro", quiet=quiet) as progress:
        report = run_dataparallel(spec, progress=progress)
    if expect is not None and report.exit_code_override != EXIT_HARNESS_FAILURE:
        report.facts["expect"] = expect.value
        report.exit_code_override = 0 if report.facts.get("verdict") == expect.value else 1
    return finish(report, fmt, output=output, facts_view=render_dataparallel_facts)


def register(app: typer.Typer) -> None:
    @app.command(epilog=EPILOG)
    @guarded
    def repro(
        threads: int = typer.Option(3, "--threads", "-n", help="Worker threads in each multi-thread trial."),
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
                                    help="cold: a fresh TORCHINDUCTOR_CACHE_DIR per trial; warm: the current one."),
        steps: int = typer.Option(
            3, "--steps", help="Steps per thread; a thread done early keeps stepping while another is still in its "
            "first step (warm threads overlapping a compile, as in training), for at most --hang-after seconds."),
        trials: int = typer.Option(3, "--trials", help="Natural trials per row (amplified: one fewer; forced and "
                                                       "stuck: one, they are deterministic)."),
        jobs: Optional[int] = typer.Option(None, "--jobs", "-j", help=f"Trials run side by side. Default: {JOBS_DEFAULT_TEXT}."),
        timeout: float = typer.Option(300.0, "--timeout", help="Seconds before a trial's child is killed."),
        max_time: Optional[float] = typer.Option(
            None, "--max-time", help="Seconds for the whole run: at it every trial still running is stopped and "
            "the report keeps what had ended (facts.partial); a verdict found by then stands, an unfinished "
            "row reads inconclusive. Bounds a --matrix on a loaded machine."),
        hang_after: float = typer.Option(
            60.0, "--hang-after", help="Seconds without progress before a child is called hung (a lock cycle in the "
                                       "stacks is reported within seconds, without waiting for this)."),
        mode: Mode = typer.Option(Mode.AUTO, "--mode",
                                  help="auto (climb the ladder); or one stress only: natural; amplified (sleep in FX "
                                       "proxy creation); forced (a thread holds the FX flag); stuck (two traces exit "
                                       "out of order); dataparallel (nn.DataParallel's replica threads over a "
                                       "compiled model, --threads replicas on one device, each form in its own "
                                       "process; --mitigation compile-outside-dataparallel or processes)."),
        mitigation: str = typer.Option(registry.NONE, "--mitigation", help=registry.help_text()),
        matrix: bool = typer.Option(
            False, "--matrix", help="Put every mitigation through its stress ladder against one baseline; a row "
            "reads fails / holds / inconclusive with per-stress counts. Verdict and exit code stay those of "
            "--mitigation."),
        amplify_ms: float = typer.Option(2.0, "--amplify-ms", help="Sleep per FX proxy in amplified trials."),
        preset: Optional[str] = typer.Option(
            None, "--preset", help="Reference drafter size. Default: replay (128 query rows, the flex_attention kernel "
            "training takes); tiny, small, seeds."),
        model: Optional[str] = typer.Option(None, "--model",
                                            help="pkg.module:factory replaying your own model (runs your code)."),
        model_compile: ModelCompile = typer.Option(
            ModelCompile.WHOLE, "--model-compile",
            help="whole: repro wraps the --model module in torch.compile; yours: no wrapper, the module compiles "
                 "what it compiles itself (a model that compiles only flex_attention or one block)."),
        step: Optional[str] = typer.Option(
            None, "--step", help="pkg.module:make_step replaying your own training step as written: "
            "make_step(device, shape_index) returns a callable that runs one step (runs your code)."),
        trace: Optional[Path] = typer.Option(None, "--trace", dir_okay=False,
                                             help="Write the timeline as Chrome trace JSON (open in Perfetto)."),
        expect: Optional[Expect] = typer.Option(None, "--expect",
                                                help="CI assertion: exit 0 when the verdict matches, else 1."),
        fmt: OutputFormat = FORMAT_OPTION,
        output: Optional[Path] = OUTPUT_OPTION,
        quiet: bool = QUIET_OPTION,
    ) -> int:
        """Replay the drafter step in one thread, then in N threads up the stress ladder (each trial in its own
        process); name the race (FX-flag leak, stuck flag, deadlock), blame the thread, and test the fixes."""
        check_output(output)
        check_output(trace, [output], "--trace")
        from dflash_doctor.render.progress_view import reporting
        from dflash_doctor.report.last_repro import made_here, utc_now
        from dflash_doctor.render.repro_view import render_repro_facts, verdict_words
        from dflash_doctor.repro.harness import EXIT_HARNESS_FAILURE, run_repro, trace_phases
        from dflash_doctor.repro.spec import DEFAULT_PRESET, ReproSpec, parse_devices

        devices = parse_devices(detect_device() if device is None else device)
        if mode is Mode.DATAPARALLEL:
            return _dataparallel(threads, devices, steps, timeout, mitigation, fmt, output, quiet, expect)
        spec = ReproSpec(
            threads=threads, devices=devices, backward=backward, checkpoint=checkpoint.value, shapes=shapes.value,
            cache=cache.value, steps=steps, trials=trials, timeout_s=timeout, hang_after_s=hang_after,
            mode=mode.value, mitigation=registry.parse(mitigation), amplify_ms=amplify_ms, preset=preset or DEFAULT_PRESET,
            model=model, model_compile=model_compile.value, step=step, jobs=jobs, max_time_s=max_time,
        ).validate()
        check_torch(devices)
        started = utc_now()
        with reporting("repro", quiet=quiet) as progress:
            report = run_repro(spec, matrix=matrix, progress=progress)
        report.facts["made"] = made_here(started, utc_now())  # so `report` can say which run it bundles
        stopped = report.stopped_by is not None  # a signal: the partial report keeps its 130/143
        if expect is not None and report.exit_code_override != EXIT_HARNESS_FAILURE and not stopped:
            report.facts["expect"] = expect.value
            report.exit_code_override = 0 if report.facts.get("verdict") == expect.value else 1
        from dflash_doctor.runtime.chrome_trace import write_chrome_trace

        write_artifact(report, "--trace", trace, lambda path: write_chrome_trace(path, trace_phases(report.facts)))
        from dflash_doctor.report.last_repro import remember_repro

        if not stopped:  # a partial run is no result to bundle later, and has no verdict to close with
            remember_repro(report, report.exit_code())  # what `dflash-doctor report` bundles without re-running
            report.summary = verdict_words(report.facts)  # the closing line reads as the verdict, not a count
        return finish(report, fmt, output=output, facts_view=render_repro_facts)

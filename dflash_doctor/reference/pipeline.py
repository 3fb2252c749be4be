"""Orchestration: turn the user's options into a RunPlan, run the workers (threads or processes), add FLOPs/MFU.

Returns a PipelineResult; never prints. Progress goes to an injected `Progress`, step lines to `logging`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

from dflash_doctor.reference.config import CHECKPOINT_MODES, preset
from dflash_doctor.reference.results import FailHow, PipelineResult, Progress, RunPlan, Transport
from dflash_doctor.reference.signals import StopRequest

WORKER_MODES = ("threads", "processes")
MAX_SEED = 2 ** 63 - 1
MAX_BATCH = 1024  # sequences per drafter step; past this a step needs more memory than any GPU has


@dataclass(frozen=True)
class PipelineOptions:
    preset: str = "tiny"
    device: str = "cpu"  # cpu | cuda
    workers: Optional[str] = None  # threads | processes; default threads, or processes for --mitigation processes
    steps: Optional[int] = None  # default: the preset's
    checkpoint: str = "none"
    target_devices: Optional[str] = None  # "0,1,2" or "cuda:0,cuda:1"; one worker per entry
    drafter_devices: Optional[str] = None
    save_dir: Optional[str] = None
    resume: bool = False
    seed: int = 0
    fail_worker: Optional[str] = None
    fail_at_step: int = 1
    fail_how: str = FailHow.KILL.value
    hf_checkpoint: Optional[str] = None
    stall_timeout_s: float = 600.0
    mitigation: str = "none"  # names from dflash_doctor.mitigations, comma-separated
    transport: str = Transport.AUTO.value
    batch_size: Optional[int] = None  # sequences per drafter step; default: the preset's
    compile_dense: Optional[bool] = None  # the drafter's dense stretches compiled whole; default: the preset's
    tracing_thread: bool = False  # threads only: a thread looping torch.fx.symbolic_trace beside the workers


def parse_devices(spec: str, device_type: str, available: Optional[int]) -> List[str]:
    """`available` None checks the spelling alone (before torch is imported to count the devices)."""
    devices = []
    for raw in (part.strip() for part in spec.split(",")):
        if not raw:
            continue
        name = f"{device_type}:{raw}" if raw.isdigit() else raw
        kind, _, index = name.partition(":")
        if kind != device_type:
            raise ValueError(f"device {raw!r} is not a {device_type} device (--device {device_type})")
        if kind == "cuda" and index and available is not None and int(index) >= available:
            raise ValueError(f"device {raw!r}: only {available} CUDA device(s) here")
        devices.append(name if kind == "cuda" else "cpu")
    if not devices:
        raise ValueError(f"empty device list {spec!r}")
    return devices


def default_devices(targets: int, drafters: int, device_type: str, available: int):
    """The preset's worker counts spread over the devices present: targets first, drafters on the rest.

    One device: everything shares it. Fewer devices than workers: workers share devices round-robin within their
    role's share (the seeds' 5 + 3 on 8 GPUs maps one worker per GPU).
    """
    if device_type == "cpu":
        return ["cpu"] * targets, ["cpu"] * drafters
    if available == 1:
        return ["cuda:0"] * targets, ["cuda:0"] * drafters
    target_share = max(1, min(available - 1, round(available * targets / (targets + drafters))))
    drafter_share = available - target_share
    return ([f"cuda:{i % target_share}" for i in range(targets)],
            [f"cuda:{target_share + i % drafter_share}" for i in range(drafters)])


def check_hf_checkpoint(path: str) -> None:
    """Fail before any worker starts: a local folder with config.json, and transformers importable."""
    from pathlib import Path

    from dflash_doctor.errors import require

    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"--target-checkpoint {path} is not a local Hugging Face checkpoint (no config.json in it)")
    require("transformers", package="transformers", install="pip install transformers", purpose="--target-checkpoint")


def _choice(enum_type, value: str, option: str):
    try:
        return enum_type(value)
    except ValueError:
        raise ValueError(f"{option} must be one of {', '.join(m.value for m in enum_type)}, not {value!r}") from None


def resolve_mitigations(options: PipelineOptions) -> Tuple[Tuple[str, ...], str]:
    """(the mitigations to apply in set-up, the worker mode); `processes` is a worker mode, not a set-up step."""
    from dflash_doctor import mitigations

    names = mitigations.parse(options.mitigation)  # raises UsageError with the registry's vocabulary
    separate = [n for n in names if mitigations.get(n).separate_processes]
    if separate and options.workers == "threads":
        raise ValueError(f"--mitigation {separate[0]} runs every worker in a process of its own; it cannot be "
                         "combined with --workers threads")
    workers = "processes" if separate else (options.workers or "threads")
    if workers not in WORKER_MODES:
        raise ValueError(f"--workers must be one of {WORKER_MODES}, not {workers!r}")
    return tuple(n for n in names if n not in separate), workers


def check_save_folder(path: str) -> None:
    """Fail before training, not after it: the folder must exist or be creatable and be writable, and a
    drafter.pt already there must be a file the checkpoint can replace. Temporaries of saves a kill -9 cut
    short are removed here, on the next start."""
    import os
    import stat
    import tempfile
    from pathlib import Path

    from dflash_doctor.outputs import file_kind
    from dflash_doctor.reference.checkpoint_files import checkpoint_path, remove_stale_temporaries

    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise ValueError(f"--save {path}: cannot write there ({exc.strerror or exc.__class__.__name__})") from None
    target = checkpoint_path(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise ValueError(f"--save {path}: {target}: {exc.strerror or exc}") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(f"--save {path}: {target} is {file_kind(mode)}; the checkpoint cannot replace it")
    remove_stale_temporaries(path)


def _check_failure_hook(options: PipelineOptions, names: List[str]) -> FailHow:
    """What check_options could not judge: the worker names, which follow the devices torch sees."""
    if options.fail_worker and options.fail_worker not in names:
        raise ValueError(f"--fail-worker {options.fail_worker!r} is not a worker of this run ({', '.join(names)})")
    return _choice(FailHow, options.fail_how, "--fail-how")


def _check_transport(options: PipelineOptions, targets: List[str], drafters: List[str]) -> Transport:
    from dflash_doctor.reference.transport import routes

    transport = _choice(Transport, options.transport, "--transport")  # (with threads, refused by check_options)
    if transport is Transport.IPC:
        sources, _ = routes(len(targets), len(drafters))
        crossing = sorted({(targets[t], drafters[d]) for d, own in enumerate(sources) for t in own
                           if targets[t] != drafters[d]})
        if crossing:
            raise ValueError(f"--transport ipc needs each target and its drafter on one device; {crossing[0][0]} "
                             f"feeds {crossing[0][1]} (use --transport auto: NCCL between devices)")
    return transport


def check_options(options: PipelineOptions) -> None:
    """Everything that can be judged without torch: the command calls it before importing torch (seconds on a
    loaded machine), so a mistyped option or a contradiction is one line at once; make_plan calls it too. Left to
    make_plan: what needs the devices torch sees (CUDA counts, --fail-worker's names, --transport ipc's pairs) and
    reading a checkpoint that exists."""
    from dflash_doctor.reference.checkpoint_files import checkpoint_path

    cfg = preset(options.preset)
    if options.batch_size is not None and not 1 <= options.batch_size <= MAX_BATCH:
        raise ValueError(f"--batch-size must be in 1..{MAX_BATCH}, got {options.batch_size}")
    if options.checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"--checkpoint must be one of {CHECKPOINT_MODES}, not {options.checkpoint!r}")
    if options.device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, not {options.device!r}")
    if not 0 <= options.seed <= MAX_SEED:
        raise ValueError(f"--seed must be in 0..{MAX_SEED}, got {options.seed}")
    for spec in (options.target_devices, options.drafter_devices):
        if spec:
            parse_devices(spec, options.device, None)
    _, workers = resolve_mitigations(options)
    if options.tracing_thread and workers != "threads":
        raise ValueError("--tracing-thread runs beside thread workers (it is the race between threads of one "
                         "process); it cannot be combined with --workers processes")
    if (cfg.steps if options.steps is None else options.steps) < 1:
        raise ValueError("--steps must be at least 1")
    if not math.isfinite(options.stall_timeout_s) or options.stall_timeout_s <= 0:
        raise ValueError("--stall-timeout must be a positive number of seconds")
    if options.resume and not options.save_dir:
        raise ValueError("--resume needs --save DIR (the folder holding the checkpoint)")
    if options.fail_at_step < 1:
        raise ValueError(f"--fail-at-step must be at least 1 (a worker's first step is 1), got {options.fail_at_step}")
    _choice(FailHow, options.fail_how, "--fail-how")
    if _choice(Transport, options.transport, "--transport") is not Transport.AUTO and workers == "threads":
        raise ValueError(f"--transport {options.transport} is for --workers processes (threads share one queue)")
    if options.save_dir:
        if options.resume and not checkpoint_path(options.save_dir).is_file():  # before the folder is made
            raise ValueError(f"--resume: no checkpoint in {options.save_dir}")
        check_save_folder(options.save_dir)
    if options.hf_checkpoint:
        check_hf_checkpoint(options.hf_checkpoint)


def make_plan(options: PipelineOptions, cuda_device_count=None) -> RunPlan:
    """Validate options into a RunPlan; raises ValueError (or UsageError) with one clear line for anything wrong."""
    from dflash_doctor.reference.attention import default_path
    from dflash_doctor.reference.checkpoint_files import load_drafter

    import torch

    check_options(options)
    cfg = preset(options.preset)
    if options.batch_size is not None:
        cfg = replace(cfg, batch_size=options.batch_size)
    if options.compile_dense is not None:
        cfg = replace(cfg, compile_dense=options.compile_dense)
    names = resolve_mitigations(options)[0]
    available = (cuda_device_count or torch.cuda.device_count)() if options.device == "cuda" else 0
    if options.device == "cuda" and available == 0:
        raise ValueError("--device cuda: no CUDA device is visible to this torch "
                         f"({torch.__version__}); use --device cpu")
    targets, drafters = default_devices(cfg.target_workers, cfg.drafter_workers, options.device, available)
    if options.target_devices:
        targets = parse_devices(options.target_devices, options.device, available)
    if options.drafter_devices:
        drafters = parse_devices(options.drafter_devices, options.device, available)
    steps = cfg.steps if options.steps is None else options.steps
    worker_names = [f"target-{i}" for i in range(len(targets))] + [f"drafter-{i}" for i in range(len(drafters))]
    fail_how = _check_failure_hook(options, worker_names)
    transport = _check_transport(options, targets, drafters)
    state = load_drafter(options.save_dir, cfg.name) if options.resume and options.save_dir else None
    if options.resume and state is None:
        raise ValueError(f"--resume: no checkpoint in {options.save_dir}")
    start = state.step if state else 0
    return RunPlan(
        cfg=cfg, device_type=options.device, target_devices=targets, drafter_devices=drafters, steps=steps,
        checkpoint=options.checkpoint, attention_path=default_path(torch.device(options.device), backward=True),
        seed=options.seed, start_step=start, resume_state=state, save_dir=options.save_dir,
        fail_worker=options.fail_worker, fail_at_step=options.fail_at_step, fail_how=fail_how,
        hf_checkpoint=options.hf_checkpoint, stall_timeout_s=options.stall_timeout_s, mitigations=names,
        transport=transport, tracing_thread=options.tracing_thread,
    )


def workers_mode(options: PipelineOptions) -> str:
    return resolve_mitigations(options)[1]


def run_plan(plan: RunPlan, workers: str = "threads", progress: Optional[Progress] = None,
             stop: Optional[StopRequest] = None) -> PipelineResult:
    """Run the workers of `plan` as threads or processes and add model FLOPs and MFU on a GPU."""
    import time

    import psutil

    startup_s = time.time() - psutil.Process().create_time()
    if workers == "threads":
        from dflash_doctor.reference.workers_threads import run_threads

        result = run_threads(plan, progress, stop=stop)
    else:
        from dflash_doctor.reference.workers_processes import run_processes

        result = run_processes(plan, progress, stop=stop)
    return with_utilisation(replace(result, startup_s=round(startup_s, 3)), plan)


def run_pipeline(options: PipelineOptions, progress: Optional[Progress] = None) -> PipelineResult:
    return run_plan(make_plan(options), workers_mode(options), progress)


def with_utilisation(result: PipelineResult, plan: RunPlan) -> PipelineResult:
    from dflash_doctor.reference.flops import flops_per_token, mfu

    if plan.device_type != "cuda":
        return result
    import torch

    used = sorted(set(plan.target_devices) | set(plan.drafter_devices))
    names = [torch.cuda.get_device_name(torch.device(d)) for d in used]
    blocks = [plan.drafter_cfg(i).blocks_per_seq for i in range(len(plan.drafter_devices))]
    flops = flops_per_token(plan.cfg, sum(blocks) / len(blocks))
    return replace(result, flops_per_token=flops, mfu=mfu(flops, result.tokens_per_s, names))

"""Orchestration: turn the user's options into a RunPlan, run the workers (threads or processes), add FLOPs/MFU.

Returns a PipelineResult; never prints. Progress goes to an injected callback, step lines to `logging`.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import List, Optional

from dflash_doctor.reference.config import CHECKPOINT_MODES, preset
from dflash_doctor.reference.results import PipelineResult, Progress, RunPlan, no_progress

WORKER_MODES = ("threads", "processes")


@dataclass(frozen=True)
class PipelineOptions:
    preset: str = "tiny"
    device: str = "cpu"  # cpu | cuda
    workers: str = "threads"
    steps: Optional[int] = None  # default: the preset's
    checkpoint: str = "none"
    target_devices: Optional[str] = None  # "0,1,2" or "cuda:0,cuda:1"; one worker per entry
    drafter_devices: Optional[str] = None
    save_dir: Optional[str] = None
    resume: bool = False
    seed: int = 0
    fail_worker: Optional[str] = None
    fail_at_step: int = 1
    hf_checkpoint: Optional[str] = None
    stall_timeout_s: float = 600.0


def parse_devices(spec: str, device_type: str, available: int) -> List[str]:
    devices = []
    for raw in (part.strip() for part in spec.split(",")):
        if not raw:
            continue
        name = f"{device_type}:{raw}" if raw.isdigit() else raw
        kind, _, index = name.partition(":")
        if kind != device_type:
            raise ValueError(f"device {raw!r} is not a {device_type} device (--device {device_type})")
        if kind == "cuda" and index and int(index) >= available:
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


def make_plan(options: PipelineOptions, cuda_device_count=None) -> RunPlan:
    """Validate options into a RunPlan; raises ValueError with one clear line for anything wrong."""
    from dflash_doctor.reference.attention import default_path
    from dflash_doctor.reference.checkpointing import load_drafter

    import torch

    cfg = preset(options.preset)
    if options.workers not in WORKER_MODES:
        raise ValueError(f"--workers must be one of {WORKER_MODES}, not {options.workers!r}")
    if options.checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"--checkpoint must be one of {CHECKPOINT_MODES}, not {options.checkpoint!r}")
    if options.device not in ("cpu", "cuda"):
        raise ValueError(f"--device must be cpu or cuda, not {options.device!r}")
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
    if steps < 1:
        raise ValueError("--steps must be at least 1")
    if options.stall_timeout_s <= 0:
        raise ValueError("--stall-timeout must be positive")
    if options.resume and not options.save_dir:
        raise ValueError("--resume needs --save DIR (the folder holding the checkpoint)")
    state = load_drafter(options.save_dir, cfg.name) if options.resume else None
    if options.resume and state is None:
        raise ValueError(f"--resume: no checkpoint in {options.save_dir}")
    names = [f"target-{i}" for i in range(len(targets))] + [f"drafter-{i}" for i in range(len(drafters))]
    if options.fail_worker and options.fail_worker not in names:
        raise ValueError(f"--fail-worker {options.fail_worker!r} is not a worker of this run ({', '.join(names)})")
    if options.hf_checkpoint:
        check_hf_checkpoint(options.hf_checkpoint)
    start = int(state["step"]) if state else 0
    return RunPlan(
        cfg=cfg, device_type=options.device, target_devices=targets, drafter_devices=drafters, steps=steps,
        checkpoint=options.checkpoint, attention_path=default_path(torch.device(options.device), backward=True),
        seed=options.seed, start_step=start, resume_state=state, save_dir=options.save_dir,
        fail_worker=options.fail_worker, fail_at_step=options.fail_at_step,
        hf_checkpoint=options.hf_checkpoint, stall_timeout_s=options.stall_timeout_s,
    )


def run_plan(plan: RunPlan, workers: str = "threads", progress: Progress = no_progress) -> PipelineResult:
    """Run the workers of `plan` as threads or processes and add model FLOPs and MFU on a GPU."""
    if workers == "threads":
        from dflash_doctor.reference.workers_threads import run_threads as runner
    else:
        from dflash_doctor.reference.workers_processes import run_processes as runner
    return with_utilisation(runner(plan, progress), plan)


def run_pipeline(options: PipelineOptions, progress: Progress = no_progress) -> PipelineResult:
    return run_plan(make_plan(options), options.workers, progress)


def with_utilisation(result: PipelineResult, plan: RunPlan) -> PipelineResult:
    from dflash_doctor.reference.flops import flops_per_token, mfu

    if plan.device_type != "cuda":
        return result
    import torch

    used = sorted(set(plan.target_devices) | set(plan.drafter_devices))
    names = [torch.cuda.get_device_name(torch.device(d)) for d in used]
    return replace(result, flops_per_token=flops_per_token(plan.cfg), mfu=mfu(plan.cfg, result.tokens_per_s, names))

"""Set-up, the phase before the first drafter step: mitigations, the frozen target (one per device), the shared
corpus, the target's forward as a CUDA graph, the drafters, and the `warmup` mitigation's serial first steps.

It is its own phase in the report (seconds per part) and never counts as a stall. Threads mode runs it once in a
set-up thread before any worker thread starts (so CUDA graph capture has the GPU to itself); each process of
`--workers processes` runs its own part of it. Every part says what it is doing through `Progress.phase`.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Sequence, Tuple

import torch

from dflash_doctor import mitigations
from dflash_doctor.reference.facts import WrittenCorpusFacts
from dflash_doctor.reference.results import Progress, RunPlan
from dflash_doctor.reference.roles import DrafterRole, target_dtype

LOG = logging.getLogger("dflash_doctor.reference")


class SetupStopped(Exception):
    """The run was asked to stop (a signal) while set-up was under way."""


@dataclass
class SetupLog:
    """Seconds per set-up part, and the progress messages that go with them."""

    progress: Progress
    stop: threading.Event = field(default_factory=threading.Event)
    clock: Callable[[], float] = time.perf_counter
    seconds: Dict[str, float] = field(default_factory=dict)

    @contextmanager
    def part(self, name: str, workers: Sequence[str], text: str) -> Iterator[None]:
        if self.stop.is_set():
            raise SetupStopped(name)
        for worker in workers:
            self.progress.phase(worker, text)
        LOG.info("set-up: %s", text)
        began = self.clock()
        yield
        self.seconds[name] = round(self.seconds.get(name, 0.0) + self.clock() - began, 3)


def apply_mitigations(names: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """Run each mitigation's process-wide set-up (before any compile wrapper exists); raises MitigationFailed
    when one cannot apply to this torch. Returns what each reported."""
    facts = {}
    for name in names:
        entry = mitigations.get(name)
        if entry.setup is not None:
            facts[name] = entry.setup()
    return facts


def wrap_step(names: Sequence[str], step: Callable) -> Callable:
    """The drafter's compute step wrapped by every mitigation that wraps steps (the locks)."""
    for name in names:
        entry = mitigations.get(name)
        if entry.wrap_step is not None:
            step = entry.wrap_step(step)
    return step


def wants_warm_up(names: Sequence[str]) -> bool:
    return any(mitigations.get(name).warm_up for name in names)


def build_target(plan: RunPlan, device: torch.device):
    from dflash_doctor.reference.target import build_target as build_random, load_hf_target

    cfg = plan.cfg
    if plan.hf_checkpoint:
        return load_hf_target(plan.hf_checkpoint, cfg.target_layer_ids, device, target_dtype(device))
    return build_random(cfg.target, cfg.target_layer_ids, plan.seed, device, target_dtype(device))


def write_corpus(plan: RunPlan, target, device: torch.device) -> Tuple[torch.Tensor, WrittenCorpusFacts]:
    from dflash_doctor.reference.corpus import write_corpus as write

    cfg = plan.cfg
    corpus, facts = write(target, cfg.corpus_size, cfg.prompt_len, cfg.seq_len, plan.seed, device)
    LOG.info("corpus ready in %.1f s (%s decode)", facts.seconds, facts.decode)
    return corpus, facts.to_dict()


def corpus_text(plan: RunPlan) -> str:
    cfg = plan.cfg
    return (f"writing the corpus: {cfg.corpus_size} greedy continuations, {cfg.prompt_len} -> {cfg.seq_len} "
            "tokens, once for every target worker")


def forward_text(device) -> str:
    return (f"capturing the target's forward on {device} as a CUDA graph" if str(device).startswith("cuda")
            else f"preparing the target's forward on {device}")


def target_forward(plan: RunPlan, target, device: torch.device) -> Tuple[Callable, str]:
    """The forward target workers call: replayed from a CUDA graph when it can be, else eager; and how."""
    from dflash_doctor.reference.graphs import GraphedForward

    if plan.hf_checkpoint or device.type != "cuda":
        return target, "eager"
    # The throughput presets fuse the target's layers too: eager, its norms, RoPE and residuals were a third of
    # the GPU's busy time once the drafter's were compiled (docs/gpu-results.md). The capture's warm-up compiles
    # them here, in the main thread, before any worker thread exists.
    target.compile_layers = plan.cfg.compile_dense
    graphed = GraphedForward(target, plan.cfg.batch_size, plan.cfg.seq_len, device)
    how = graphed.mode if graphed.fallback_reason is None else f"eager ({graphed.fallback_reason})"
    return graphed, ("compiled, " + how) if target.compile_layers else how


def drafter_heads(plan: RunPlan, device: torch.device, target=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The frozen target's embedding and LM head on `device`: a target already there shares its tensors;
    otherwise they are built alone (same seeds, same values) or read from the checkpoint."""
    from dflash_doctor.reference.target import build_target_heads

    if target is None and plan.hf_checkpoint:
        target = build_target(plan, device)
    if target is not None:
        return target.embed.weight, target.lm_head.weight
    heads = build_target_heads(plan.cfg.target, plan.seed, device, target_dtype(device))
    return heads.embed.weight, heads.lm_head.weight


def build_drafter(plan: RunPlan, index: int, device: torch.device, heads) -> DrafterRole:
    return DrafterRole(plan.drafter_cfg(index), index, device, plan.seed, plan.checkpoint, plan.attention_path,
                       heads, plan.resume_state)


@dataclass
class ThreadWorld:
    """Everything the worker threads share, made by `set_up_threads`."""

    corpus: torch.Tensor
    forwards: Dict[str, Callable]  # per target device
    drafters: list  # DrafterRole per drafter worker
    corpus_facts: WrittenCorpusFacts
    target_forward: str


def set_up_threads(plan: RunPlan, log: SetupLog) -> ThreadWorld:
    """Set-up for threads mode, in one thread, before any worker starts (mitigations were applied already)."""
    targets, drafters = plan.target_names(), plan.drafter_names()
    models: Dict[str, object] = {}
    for device in dict.fromkeys(plan.target_devices):
        users = [n for n, d in zip(targets, plan.target_devices) if d == device]
        with log.part("targets", users, f"building the target on {device}"):
            models[device] = build_target(plan, torch.device(device))
    first = plan.target_devices[0]
    with log.part("corpus", targets, corpus_text(plan)):
        corpus, corpus_facts = write_corpus(plan, models[first], torch.device(first))
    forwards, modes = {}, []
    for device, model in models.items():
        users = [n for n, d in zip(targets, plan.target_devices) if d == device]
        with log.part("target-graph", users, forward_text(device)):
            forwards[device], mode = target_forward(plan, model, torch.device(device))
            modes.append(mode)
    roles = []
    for index, (name, device) in enumerate(zip(drafters, plan.drafter_devices)):
        with log.part("drafters", [name], f"building {name} on {device}"):
            heads = drafter_heads(plan, torch.device(device), models.get(device))
            roles.append(build_drafter(plan, index, torch.device(device), heads))
    if wants_warm_up(plan.mitigations):
        for name, role in zip(drafters, roles):
            with log.part("warm-up", [name], f"warm-up: {name}'s first step alone (compiling its graphs)"):
                role.warm_up(plan.seed)
    return ThreadWorld(corpus, forwards, roles, corpus_facts, "; ".join(dict.fromkeys(modes)))


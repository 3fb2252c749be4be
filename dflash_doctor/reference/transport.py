"""How target processes hand batches to drafter processes, and how drafter processes average gradients.

- Workers on the same device: a torch.multiprocessing queue (`ipc`). CUDA tensors travel as CUDA IPC handles:
  the drafter maps the target's memory, nothing is copied. (Before, batches went through gloo and host memory,
  about 260 ms per batch on the H200: processes ran at 0.23x threads.) On a CPU the same queue passes tensors
  through shared memory.
- Workers on different GPUs: NCCL send/recv in a two-rank group (`p2p`); on a CPU, gloo. The small header and
  the lengths always go through the gloo world group, so the receiver never waits on its GPU to read them.
- Gradients: one all-reduce of the flattened gradients over the drafters' group, NCCL when every drafter has a
  GPU of its own, gloo otherwise (through host memory on a shared GPU: NCCL refuses two ranks on one device).

The process groups every rank must create, in the same order, are listed by `group_specs` from the plan alone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from dflash_doctor.reference.results import RunPlan, Transport


def routes(targets: int, drafters: int) -> Tuple[List[List[int]], List[List[int]]]:
    """(sources of each drafter, consumers of each target): pairs (i % T, i % D), so every worker has a partner."""
    sources: List[List[int]] = [[] for _ in range(drafters)]
    consumers: List[List[int]] = [[] for _ in range(targets)]
    for i in range(max(targets, drafters)):
        sources[i % drafters].append(i % targets)
        consumers[i % targets].append(i % drafters)
    return sources, consumers


def batches_per_target(targets: int, drafters: int, steps: int) -> List[int]:
    """How many batches each target must send so every drafter gets `steps` (each drafter cycles its sources)."""
    sources, _ = routes(targets, drafters)
    counts = [0] * targets
    for own in sources:
        for step in range(steps):
            counts[own[step % len(own)]] += 1
    return counts


def route_kind(plan: RunPlan, target_device: str, drafter_device: str) -> Transport:
    """Transport.IPC or Transport.P2P (never AUTO) for one target -> drafter route (make_plan refuses
    `--transport ipc` across devices). On a CPU `auto` is gloo, the same torch.distributed code path NCCL takes
    between GPUs, so CPU runs exercise it."""
    if plan.transport is Transport.IPC:
        return Transport.IPC
    if plan.transport is Transport.AUTO and target_device == drafter_device and target_device.startswith("cuda"):
        return Transport.IPC
    return Transport.P2P


@dataclass(frozen=True)
class GroupSpec:
    name: str  # targets | drafters | pair:T:D
    ranks: Tuple[int, ...]
    backend: str  # gloo | nccl


def _distinct_gpus(devices: Sequence[str]) -> bool:
    return all(d.startswith("cuda") for d in devices) and len(set(devices)) == len(devices)


def group_specs(plan: RunPlan) -> List[GroupSpec]:
    """Every process group beyond the gloo world group, in creation order."""
    targets, drafters = len(plan.target_devices), len(plan.drafter_devices)
    specs = []
    if targets > 1:
        specs.append(GroupSpec("targets", tuple(range(targets)), "gloo"))
    if drafters > 1:
        backend = "nccl" if _distinct_gpus(plan.drafter_devices) else "gloo"
        specs.append(GroupSpec("drafters", tuple(range(targets, targets + drafters)), backend))
    sources, _ = routes(targets, drafters)
    for d, own in enumerate(sources):
        for t in sorted(set(own)):
            pair = (plan.target_devices[t], plan.drafter_devices[d])
            if route_kind(plan, *pair) is Transport.P2P and _distinct_gpus(pair):
                specs.append(GroupSpec(f"pair:{t}:{d}", (t, targets + d), "nccl"))
    return specs


def describe(plan: RunPlan) -> str:
    """One line for the report: which transport each kind of route uses."""
    targets = len(plan.target_devices)
    sources, _ = routes(targets, len(plan.drafter_devices))
    kinds = set()
    for d, own in enumerate(sources):
        for t in own:
            pair = (plan.target_devices[t], plan.drafter_devices[d])
            if route_kind(plan, *pair) is Transport.IPC:
                kinds.add("cuda-ipc" if pair[0].startswith("cuda") else "shared-memory")
            else:
                kinds.add("nccl" if _distinct_gpus(pair) else "gloo")
    return "+".join(sorted(kinds))


class Groups:
    """The process groups of one rank, made from `group_specs` (every rank calls this, members or not)."""

    def __init__(self, plan: RunPlan) -> None:
        import torch.distributed as dist

        self.by_name: Dict[str, object] = {}
        self.backends: Dict[str, str] = {}
        for spec in group_specs(plan):
            self.by_name[spec.name] = dist.new_group(list(spec.ranks), backend=spec.backend)
            self.backends[spec.name] = spec.backend

    def get(self, name: str):
        return self.by_name.get(name)


PROBE = (0, 1, 2, 3)


def offer_probe(queue, device) -> Optional[str]:
    """Target side of the IPC check: put a small tensor of `device` on the queue; the reason if that failed (a
    sandbox without CUDA IPC). A failure still puts something, so the drafter never waits for nothing."""
    import torch

    try:
        queue.put(torch.tensor(PROBE, device=device))
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means "use torch.distributed on this route"
        queue.put(None)
        return f"{exc.__class__.__name__}: {exc}"[:200]


def take_probe(queue) -> Optional[str]:
    """Drafter side: read the probe back; the reason if this process cannot map the target's memory. It waits as
    long as the target's set-up takes (a target that dies instead is the parent's to notice: it ends the run)."""
    try:
        item = queue.get()
        if item is None:
            return "the target could not share its memory"
        got = tuple(item.cpu().tolist())
        return None if got == PROBE else f"the probe read back as {got}"
    except Exception as exc:  # noqa: BLE001 - any failure means "use torch.distributed on this route"
        return f"{exc.__class__.__name__}: {exc}"[:200]


class IpcSender:
    def __init__(self, queue, device) -> None:
        self.queue, self.device = queue, device

    def send(self, batch) -> None:
        import torch

        if self.device.type == "cuda":
            # The drafter reads this memory from another process: the target's kernels must be done writing it.
            torch.cuda.current_stream(self.device).synchronize()
        # The host lengths go as a list: a CPU tensor would be moved to shared memory and its descriptor passed
        # over a socket, for eight numbers.
        self.queue.put((*batch.device_tensors(), batch.lengths_cpu.tolist()))
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()  # give back memory the drafters have finished with


class IpcReceiver:
    def __init__(self, queue) -> None:
        self.queue = queue

    def recv(self):
        import torch

        from dflash_doctor.reference.training import TargetBatch

        tokens, lengths, features, greedy, lengths_cpu = self.queue.get()
        return TargetBatch(tokens, lengths, features, greedy, torch.tensor(lengths_cpu, dtype=torch.long))


class P2pSender:
    def __init__(self, dst: int, group, device) -> None:
        self.dst, self.group, self.device = dst, group, device

    def send(self, batch) -> None:
        import torch
        import torch.distributed as dist

        header = torch.tensor(list(batch.features.shape), dtype=torch.long)
        dist.send(header, self.dst)
        dist.send(batch.lengths_cpu, self.dst)
        staged = self.group is None and self.device.type == "cuda"  # gloo between ranks of one GPU
        for tensor in (batch.tokens, batch.features, batch.greedy):
            dist.send(tensor.cpu() if staged else tensor.contiguous(), self.dst, group=self.group)


class P2pReceiver:
    def __init__(self, src: int, group, device, feature_dtype) -> None:
        self.src, self.group, self.device, self.feature_dtype = src, group, device, feature_dtype

    def recv(self):
        import torch
        import torch.distributed as dist

        from dflash_doctor.reference.training import TargetBatch

        header = torch.empty(3, dtype=torch.long)
        dist.recv(header, self.src)
        batch, seq, width = header.tolist()
        lengths = torch.empty((batch,), dtype=torch.long)
        dist.recv(lengths, self.src)
        staged = self.group is None and self.device.type == "cuda"
        where = torch.device("cpu") if staged else self.device
        parts = [torch.empty((batch, seq), dtype=torch.long, device=where),
                 torch.empty((batch, seq, width), dtype=self.feature_dtype, device=where),
                 torch.empty((batch, seq), dtype=torch.long, device=where)]
        for tensor in parts:
            dist.recv(tensor, self.src, group=self.group)
        tokens, features, greedy = (t.to(self.device) for t in parts)
        return TargetBatch(tokens, lengths.to(self.device), features, greedy, lengths)


class GradientAllReduce:
    def __init__(self, group, backend: str, device, replicas: int) -> None:
        self.group, self.device, self.replicas = group, device, replicas
        self.staged = backend == "gloo" and device.type == "cuda"

    def __call__(self, grads: list) -> list:
        import torch
        import torch.distributed as dist

        flat = torch.cat([g.reshape(-1) for g in grads])
        wire = flat.cpu() if self.staged else flat
        dist.all_reduce(wire, group=self.group)
        flat = wire.to(self.device) / self.replicas
        out, offset = [], 0
        for g in grads:
            out.append(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        return out


def ipc_queue_keys(plan: RunPlan) -> List[Tuple[int, int]]:
    """(target index, drafter index) of every route that goes through a torch.multiprocessing queue."""
    sources, _ = routes(len(plan.target_devices), len(plan.drafter_devices))
    keys = []
    for d, own in enumerate(sources):
        for t in sorted(set(own)):
            if route_kind(plan, plan.target_devices[t], plan.drafter_devices[d]) is Transport.IPC:
                keys.append((t, d))
    return keys


def pair_group(groups: Optional[Groups], t: int, d: int):
    return groups.get(f"pair:{t}:{d}") if groups is not None else None

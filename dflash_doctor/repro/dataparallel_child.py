"""One nn.DataParallel form in its own process: `python -m dflash_doctor.repro.dataparallel_child SPEC.json OUT.json`.

A fresh interpreter per form, so one form's compiles (or a model it broke) cannot reach the next. The model is
the one measured on the H100 (docs/races.md, "nn.DataParallel"): a 4-block MLP, batch 8 a replica, trained for a
few steps with SGD; the form decides who compiles what and who runs the replicas. What the child writes is
`FormResult.to_dict()` (dataparallel.py reads it back with `FormResult.from_dict`).
"""
from __future__ import annotations

import copy
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, List, Optional

import torch
from torch import nn

from dflash_doctor.outcomes import ThreadOutcome
from dflash_doctor.repro.dataparallel import DataParallelForm, FormResult, FormSpec

ROWS = 16  # tokens per sample: the MLP sees (batch, ROWS, width)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, width: int, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


_ATTEND: Optional[Callable] = None  # the compiled attention every replica calls (made once, like a module-level one)


def make_attend(device: torch.device) -> None:
    """The compiled attention function the model calls, made once in the main thread as a module-level one would
    be: flex_attention on a GPU (as measured), SDPA on a CPU (flex_attention has no CPU backward)."""
    global _ATTEND
    if device.type == "cuda":
        from torch.nn.attention.flex_attention import flex_attention

        _ATTEND = torch.compile(flex_attention)
    else:
        _ATTEND = torch.compile(nn.functional.scaled_dot_product_attention)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    assert _ATTEND is not None, "make_attend() first"
    return _ATTEND(q, k, v)


class AttentionMLP(MLP):
    """The MLP with one attention layer in front that calls a compiled function (the model itself stays eager)."""

    def __init__(self, width: int, blocks: int = 4, heads: int = 4) -> None:
        super().__init__(width, blocks)
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, rows, width = x.shape
        q, k, v = self.qkv(x).view(batch, rows, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        x = x + _attend(q, k, v).transpose(1, 2).reshape(batch, rows, width)
        return super().forward(x)


def _data_parallel(module: nn.Module, spec: FormSpec, device: torch.device) -> nn.Module:
    """nn.DataParallel with every replica on one device (a repeated id keeps a thread per replica), or its CPU
    stand-in (dataparallel_cpu.py) where torch runs no replicas."""
    if device.type == "cpu":
        from dflash_doctor.repro.dataparallel_cpu import ReplicaThreads

        return ReplicaThreads(module, spec.replicas)
    index = device.index or 0
    return nn.DataParallel(module, device_ids=[index] * spec.replicas, output_device=index)


class FormRun:
    """Builds the form, runs its steps, and keeps what the parent needs."""

    def __init__(self, spec: FormSpec) -> None:
        self.spec = spec
        self.device = torch.device(spec.device)
        torch.manual_seed(0)
        form = DataParallelForm(spec.form)
        if form is DataParallelForm.COMPILED_FUNCTION:
            make_attend(self.device)
        self.model = (AttentionMLP if form is DataParallelForm.COMPILED_FUNCTION else MLP)(spec.width).to(self.device)
        self.tree = self.module_tree(self.model)
        self.forward = self.build(form)
        params = list(self.model.parameters()) + [p for m in getattr(self, "per_replica", []) for p in m.parameters()]
        self.optimizer = torch.optim.SGD(params, lr=1e-3)

    @staticmethod
    def module_tree(model: nn.Module) -> List[str]:
        return [name for name, _ in model.named_modules()]

    def build(self, form: DataParallelForm) -> Callable[[torch.Tensor], torch.Tensor]:
        spec, model = self.spec, self.model
        if form is DataParallelForm.COMPILED_INSIDE:
            compiled: nn.Module = torch.compile(model)  # type: ignore[assignment]  # an OptimizedModule
            return _data_parallel(compiled, spec, self.device)
        if form is DataParallelForm.COMPILED_OUTSIDE:
            return torch.compile(_data_parallel(model, spec, self.device))
        if form is DataParallelForm.COMPILED_FUNCTION:
            return _data_parallel(model, spec, self.device)
        if form is DataParallelForm.PER_REPLICA:
            from dflash_doctor.repro.dataparallel_cpu import per_replica_apply

            self.per_replica = [torch.compile(copy.deepcopy(model)) for _ in range(spec.replicas)]

            def forward(x: torch.Tensor) -> torch.Tensor:
                outputs = per_replica_apply(self.per_replica, x.chunk(spec.replicas), self.device)
                return torch.cat(outputs)

            return forward
        raise ValueError(f"{form} runs in processes of its own (run_processes)")

    def batch(self) -> torch.Tensor:
        return torch.randn(8 * self.spec.replicas, ROWS, self.spec.width, device=self.device)

    def step(self) -> float:
        loss = self.forward(self.batch()).float().pow(2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    def run(self, result: FormResult) -> None:
        started = time.perf_counter()
        for index in range(self.spec.steps):
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - the error is what this child reports
                result.outcome = ThreadOutcome.ERROR
                result.error = f"{type(exc).__name__}: {exc}"
                result.traceback = traceback.format_exc(limit=20)[-6000:]
                break
            result.steps = index + 1
            result.step_s.append(round(time.perf_counter() - started, 3))
        else:
            result.outcome = ThreadOutcome.OK
        result.model_intact = self.module_tree(self.model) == self.tree
        result.model_tree_after = self.module_tree(self.model)[:12]
        from torch._dynamo.utils import counters

        result.graphs = int(counters["stats"].get("unique_graphs", 0))


def _process_worker(rank: int, spec: FormSpec, store_path: str, out_dir: str) -> None:
    """One replica in a process of its own: DistributedDataParallel over gloo, compiled as the DDP docs show."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    result = FormResult(form=spec.form, device=spec.device, replicas=1)
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=spec.replicas)
        device = torch.device(spec.device)
        torch.manual_seed(0)
        model = MLP(spec.width).to(device)
        ddp = DistributedDataParallel(model, device_ids=[device.index or 0] if device.type == "cuda" else None)
        compiled = torch.compile(ddp)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        started = time.perf_counter()
        for index in range(spec.steps):
            loss = compiled(torch.randn(8, ROWS, spec.width, device=device)).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            result.steps = index + 1
            result.step_s.append(round(time.perf_counter() - started, 3))
        result.outcome = ThreadOutcome.OK
        from torch._dynamo.utils import counters

        result.graphs = int(counters["stats"].get("unique_graphs", 0))
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        result.outcome = ThreadOutcome.ERROR
        result.error = f"{type(exc).__name__}: {exc}"
        result.traceback = traceback.format_exc(limit=12)[-4000:]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result.to_dict()), encoding="utf-8")


def run_processes(spec: FormSpec, result: FormResult, work: Path) -> None:
    import torch.multiprocessing as mp

    started = time.perf_counter()
    mp.spawn(_process_worker, args=(spec, str(work / "store"), str(work)), nprocs=spec.replicas, join=True)
    ranks = [FormResult.from_dict(json.loads((work / f"rank{r}.json").read_text(encoding="utf-8")))
             for r in range(spec.replicas)]
    failed = [r for r in ranks if r.outcome != ThreadOutcome.OK]
    result.outcome = ThreadOutcome.ERROR if failed else ThreadOutcome.OK
    result.steps = min(r.steps for r in ranks)
    result.graphs = sum(r.graphs for r in ranks)
    result.step_s = [round(time.perf_counter() - started, 3)]
    if failed:
        result.error, result.traceback = failed[0].error, failed[0].traceback
    result.model_intact = True


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = FormSpec.from_dict(json.loads(Path(argv[0]).read_text(encoding="utf-8")))
    out = Path(argv[1])
    result = FormResult(form=spec.form, device=spec.device, replicas=spec.replicas,
                        torch_version=torch.__version__)
    started = time.perf_counter()
    try:
        if DataParallelForm(spec.form) is DataParallelForm.PROCESSES:
            run_processes(spec, result, out.parent)
        else:
            FormRun(spec).run(result)
    except Exception as exc:  # noqa: BLE001 - building the form failed: that is its result
        result.outcome = ThreadOutcome.ERROR
        result.error = f"{type(exc).__name__}: {exc}"
        result.traceback = traceback.format_exc(limit=20)[-6000:]
    result.seconds = round(time.perf_counter() - started, 3)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict()), encoding="utf-8")
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

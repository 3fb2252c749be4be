"""How many torch ops (on a GPU: kernel launches, each one a Python-to-driver round trip) the reference pipeline
dispatches per unit of work, counted on the CPU with a dispatch mode, plus the CPU wall time of the same units.

Why a count: on the H200 the pipeline was launch-bound in places (an eager greedy decode step cost about 48 ms for
a few hundred tiny kernels), and the count is what CUDA graphs and fused kernels remove; unlike a CPU timing it
does not depend on how busy this machine is. Units: one target forward, one greedy decode step (on a GPU it is
replayed from a CUDA graph: one launch), one drafter training step (forward, backward, optimizer).

    python benchmarks/pipeline_ops.py [--write]   # --write: benchmarks/results/pipeline_ops.md
"""
from __future__ import annotations

import argparse
import collections
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    return Count()


def _measure(unit, repeats: int = 5):
    unit()  # first call: lazy initialisation is not part of the unit
    counter = _counter()
    with counter:
        unit()
    began = time.perf_counter()
    for _ in range(repeats):
        unit()
    return sum(counter.ops.values()), (time.perf_counter() - began) / repeats, counter.ops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/pipeline_ops.md")
    args = parser.parse_args(argv)
    import torch

    from dflash_doctor.reference.config import TINY
    from dflash_doctor.reference.corpus import GreedyDecoder
    from dflash_doctor.reference.roles import DrafterRole
    from dflash_doctor.reference.target import build_target
    from dflash_doctor.reference.training import TargetBatch

    torch.set_num_threads(1)
    # The small preset's depth (8 target layers, 2 drafter layers, 3 feature layers) at the tiny preset's width:
    # op counts depend on depth, not on width.
    cfg = replace(TINY, target=replace(TINY.target, num_layers=8), target_layer_ids=(1, 4, 7), drafter_layers=2)
    cpu = torch.device("cpu")
    target = build_target(cfg.target, cfg.target_layer_ids, 0, cpu, torch.float32)
    tokens = torch.randint(1, cfg.target.vocab_size - 1, (4, cfg.seq_len))
    lengths = torch.full((4,), cfg.seq_len)
    out = target(tokens)
    batch = TargetBatch(tokens, lengths, out.features, out.greedy, lengths)
    drafter = DrafterRole(cfg, 0, cpu, 0, "none", "sdpa-dense", (target.embed.weight, target.lm_head.weight))
    decoder = GreedyDecoder(target, tokens[:, :8], cfg.seq_len)

    def drafter_step():
        drafter.compute(batch)
        drafter.apply()

    def decode_step():
        if decoder.pos.item() >= cfg.seq_len - 1:
            decoder.pos.fill_(8)
        decoder.step()

    rows = [("target forward (batch 4 x 64)", *_measure(lambda: target(tokens))),
            ("greedy decode step (one token for 4 sequences; one CUDA graph launch on a GPU)", *_measure(decode_step)),
            ("drafter step (forward, backward, AdamW; dense attention on the CPU)", *_measure(drafter_step))]
    lines = [
        "# Reference pipeline: ops dispatched per unit of work (`benchmarks/pipeline_ops.py`)",
        "",
        "Command: `python benchmarks/pipeline_ops.py --write`",
        "",
        f"- torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, 1 intra-op thread",
        "- model: 8 target layers, 2 drafter layers, 3 feature layers (the small preset's depth), tiny width",
        "- on a GPU every op but the views (view, t, _unsafe_view, expand...) is a kernel launch, from Python (the",
        "  forward) or from the autograd engine (the backward); an RMSNorm is one op there (`torch._fused_rms_norm`)",
        "  where this CPU build decomposes it into six",
        "- the same count on the code before issue 12 (commit 1220dfd): target forward 692, drafter step 1217; its",
        "  decode step was a whole eager forward of one token per step, launched op by op (about 750 ops)",
        "",
        "| unit | ops | CPU wall per unit | most frequent ops |",
        "|---|---|---|---|",
    ]
    for name, count, seconds, ops in rows:
        common = ", ".join(f"{op} {n}" for op, n in ops.most_common(4))
        lines.append(f"| {name} | {count} | {seconds * 1000:.1f} ms | {common} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        (REPO / "benchmarks" / "results" / "pipeline_ops.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

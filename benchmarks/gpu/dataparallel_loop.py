"""nn.DataParallel over a compiled model, as trainers write it: the script `run` is held against on the GPU
(docs/races.md, "nn.DataParallel over a compiled model").

A 4-block MLP, batch 8 a replica, a few SGD steps; the replicas sit on one GPU repeated (`device_ids=[0, 0, 0]`
keeps one thread per replica, as several GPUs would). No dflash-doctor code runs here.

    python benchmarks/gpu/dataparallel_loop.py --form inside            # nn.DataParallel(torch.compile(model))
    python benchmarks/gpu/dataparallel_loop.py --form outside           # torch.compile(nn.DataParallel(model))
    python benchmarks/gpu/dataparallel_loop.py --form inside --catch    # the trainer logs the error and goes on

Prints one JSON line at the end: the form, steps done, the first error, whether the model kept its submodules.
Exits 1 when a step failed and --catch was not given (the error propagates, as in a plain trainer).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class MLP(nn.Module):
    def __init__(self, width: int = 256, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", choices=("inside", "outside"), default="inside")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--catch", action="store_true", help="log a failed step and go on, as some trainers do")
    args = parser.parse_args()
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    model = MLP().to(device)
    names = [name for name, _ in model.named_modules()]
    ids = [0] * args.replicas
    if args.form == "inside":
        net = nn.DataParallel(torch.compile(model), device_ids=ids)
    else:
        net = torch.compile(nn.DataParallel(model, device_ids=ids))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    done, errors, started = 0, [], time.perf_counter()
    for step in range(args.steps):
        try:
            loss = net(torch.randn(8 * args.replicas, 16, 256, device=device)).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done += 1
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        except Exception as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            if not args.catch:
                raise
            print(f"step {step} failed, going on", file=sys.stderr, flush=True)
            traceback.print_exc()
    intact = [name for name, _ in model.named_modules()] == names
    print(json.dumps({"form": args.form, "replicas": args.replicas, "steps": done, "errors": errors[:3],
                      "model_intact": intact, "seconds": round(time.perf_counter() - started, 3),
                      "torch": torch.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A threaded trainer written the way the seeds' `train_dflash_pipeline.py` is (docs/races.md, "The DFlash
drafter" and "Natural runs"): target threads serve hidden states of a frozen target model to drafter threads
through queues; each drafter thread trains its own small drafter whose attention is one module-level
`torch.compile(flex_attention)` over a block-causal BlockMask built every step, with the target's context as
extra keys and values. Every thread shares one GPU. It never imports dflash_doctor: it is the "user's own
trainer" that `dflash-doctor run` must diagnose unmodified.

    python benchmarks/gpu/seeds_like_trainer.py --steps 20
    dflash-doctor run --cache cold -f json -o run.json -- python benchmarks/gpu/seeds_like_trainer.py

Prints one JSON line (each thread's outcome and steps). Exit 0 when every drafter trained --steps steps, 1 when
a thread raised, 2 when the drafters had not finished after --hang-after seconds (it then exits at once: stuck
threads never return).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

flex = torch.compile(flex_attention)  # module level, as the seeds' trainer has it

BLOCK = 16
HIDDEN, HEADS, HEAD_DIM, VOCAB = 256, 4, 64, 1024
TARGET_LAYERS = (1, 3, 5)  # target layers whose hidden states feed the drafter


class TargetModel(nn.Module):
    """A frozen stand-in for the target: embedding and six MLP blocks; returns the chosen layers' states."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.GELU())
                                    for _ in range(6))

    def forward(self, tokens):
        x, kept = self.embed(tokens), []
        for index, block in enumerate(self.blocks):
            x = x + block(x)
            if index in TARGET_LAYERS:
                kept.append(x)
        return torch.cat(kept, dim=-1)  # (B, L, HIDDEN * len(TARGET_LAYERS))


class DrafterLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(HIDDEN)
        self.q = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.kv = nn.Linear(HIDDEN, 2 * HEADS * HEAD_DIM, bias=False)
        self.out = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.mlp = nn.Sequential(nn.RMSNorm(HIDDEN), nn.Linear(HIDDEN, 4 * HIDDEN), nn.SiLU(),
                                 nn.Linear(4 * HIDDEN, HIDDEN))

    def forward(self, x, context, block_mask):
        batch, length, _ = x.shape
        h = self.norm(x)
        q = self.q(h).view(batch, length, HEADS, HEAD_DIM).transpose(1, 2)
        # K, V = cat(proj(context), proj(block)): the drafter sees the target's states as extra keys and values
        k, v = self.kv(torch.cat([context, h], dim=1)).chunk(2, dim=-1)
        k = k.view(batch, 2 * length, HEADS, HEAD_DIM).transpose(1, 2)
        v = v.view(batch, 2 * length, HEADS, HEAD_DIM).transpose(1, 2)
        attended = flex(q, k, v, block_mask=block_mask)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, HEADS * HEAD_DIM))
        return x + self.mlp(x)


class Drafter(nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.fc = nn.Linear(HIDDEN * len(TARGET_LAYERS), HIDDEN, bias=False)
        self.norm = nn.RMSNorm(HIDDEN)
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(DrafterLayer() for _ in range(layers))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens, target_states, block_mask):
        context = self.norm(self.fc(target_states))
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x, context, block_mask)
        return self.head(x)


def block_mask_for(length: int, device: str):
    """Each query block sees the context strictly before its block, and its own block both ways."""

    def mask_mod(b, h, q, kv):
        in_context = kv < length
        context_ok = in_context & (kv // BLOCK < q // BLOCK)
        block_ok = ~in_context & ((kv - length) // BLOCK == q // BLOCK)
        return context_ok | block_ok

    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=length, KV_LEN=2 * length, device=device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=2)
    parser.add_argument("--drafters", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--hang-after", type=float, default=120.0)
    args = parser.parse_args(argv)
    device = args.device
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    target = TargetModel().to(device, dtype).eval().requires_grad_(False)
    lengths = [256 * (index + 2) for index in range(args.drafters)]  # each drafter its own shape
    inboxes = [queue.Queue(maxsize=2) for _ in range(args.drafters)]
    stop = threading.Event()
    results = {}

    def serve(index: int) -> None:
        name = threading.current_thread().name
        served = 0
        try:
            while not stop.is_set():
                drafter = (index + served) % args.drafters
                tokens = torch.randint(0, VOCAB, (1, lengths[drafter]), device=device)
                with torch.no_grad():
                    states = target(tokens)
                try:
                    inboxes[drafter].put((tokens, states), timeout=0.5)
                    served += 1
                except queue.Full:
                    continue
            results[name] = {"outcome": "ok", "steps": served}
        except Exception as exc:  # noqa: BLE001 - the outcome is the data
            results[name] = {"outcome": "error", "steps": served, "error": f"{type(exc).__name__}: {exc}"[:300]}

    def train(index: int) -> None:
        name = threading.current_thread().name
        drafter = Drafter().to(device, dtype)
        optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-4)
        done = 0
        try:
            while done < args.steps:
                tokens, states = inboxes[index].get(timeout=args.hang_after)
                logits = drafter(tokens, states, block_mask_for(tokens.shape[1], device))
                loss = F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                done += 1
            results[name] = {"outcome": "ok", "steps": done}
        except Exception as exc:  # noqa: BLE001
            results[name] = {"outcome": "error", "steps": done, "error": f"{type(exc).__name__}: {exc}"[:300]}

    servers = [threading.Thread(target=serve, args=(i,), name=f"target-{i}", daemon=True)
               for i in range(args.targets)]
    drafters = [threading.Thread(target=train, args=(i,), name=f"drafter-{i}", daemon=True)
                for i in range(args.drafters)]
    started = time.perf_counter()
    for thread in servers + drafters:
        thread.start()
    deadline = time.perf_counter() + args.hang_after
    while any(t.is_alive() for t in drafters) and time.perf_counter() < deadline:
        time.sleep(0.5)
    hung = any(t.is_alive() for t in drafters)
    stop.set()
    for thread in servers:
        thread.join(10)
    failed = any(r.get("outcome") == "error" for r in results.values())
    print(json.dumps({"seconds": round(time.perf_counter() - started, 2), "hung": hung, "threads": results}),
          flush=True)
    if hung:
        os._exit(2)  # the stuck threads never return
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

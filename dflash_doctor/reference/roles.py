"""What a target worker and a drafter worker do, independent of whether they run as threads or processes."""
from __future__ import annotations

import logging
from typing import Callable, List, Optional, Tuple

import torch

from dflash_doctor.reference.checkpoint_files import DrafterCheckpoint
from dflash_doctor.reference.config import PipelineConfig
from dflash_doctor.reference.drafter import Drafter
from dflash_doctor.reference.layers import derive_seed
from dflash_doctor.reference.target import TargetOutput
from dflash_doctor.reference.training import (
    TargetBatch, drafter_loss, pad_past_lengths, random_lengths, to_device,
)

LOG = logging.getLogger("dflash_doctor.reference")

Forward = Callable[[torch.Tensor], TargetOutput]  # the target's forward (eager or replayed from a CUDA graph)


class InjectedFailure(RuntimeError):
    """Raised by the --fail-worker hook: a deliberate worker death, to exercise the clean shutdown."""


def target_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class TargetRole:
    """Serves batches: rows of the shared corpus, cut to random lengths, through the target's forward."""

    def __init__(self, cfg: PipelineConfig, index: int, device: torch.device, seed: int, corpus: torch.Tensor,
                 forward: Forward, start_step: int = 0):
        self.cfg, self.device, self.corpus, self.forward = cfg, device, corpus, forward
        # Each worker its own sampling stream (a resumed run a new one), over the same corpus and model.
        self.generator = torch.Generator().manual_seed(derive_seed(seed, "target-batches", index, start_step))

    def next_batch(self) -> TargetBatch:
        cfg = self.cfg
        rows = torch.randint(self.corpus.shape[0], (cfg.batch_size,), generator=self.generator)
        lengths = random_lengths(cfg, cfg.batch_size, self.generator)
        tokens = to_device(pad_past_lengths(self.corpus[rows], lengths, cfg.pad_token_id), self.device)
        out = self.forward(tokens)
        return TargetBatch(tokens, to_device(lengths, self.device), out.features, out.greedy, lengths)


def synthetic_batch(cfg: PipelineConfig, device: torch.device, seed: int) -> TargetBatch:
    """A batch of the real shapes and dtypes with random contents: what a warm-up step needs to compile exactly
    the graphs training will use, without a target."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "warm-up batch"))
    shape = (cfg.batch_size, cfg.seq_len)
    lengths = random_lengths(cfg, cfg.batch_size, generator)
    tokens = torch.randint(1, cfg.mask_token_id, shape, generator=generator)
    features = torch.randn(shape + (len(cfg.target_layer_ids) * cfg.target.hidden_size,), generator=generator)
    greedy = torch.randint(1, cfg.mask_token_id, shape, generator=generator)
    dtype = target_dtype(device)
    return TargetBatch(tokens.to(device), lengths.to(device), features.to(device, dtype), greedy.to(device), lengths)


class DrafterRole:
    """One drafter replica with its AdamW; replicas start identical and apply the same averaged gradients."""

    def __init__(self, cfg: PipelineConfig, index: int, device: torch.device, seed: int, checkpoint: str,
                 attention_path: str, heads: Tuple[torch.Tensor, torch.Tensor],
                 state: Optional[DrafterCheckpoint] = None):
        self.cfg, self.device, self.checkpoint, self.attention_path = cfg, device, checkpoint, attention_path
        embed, lm_head = heads
        with torch.device(device):
            self.drafter = Drafter(cfg.target, cfg.drafter_layers, len(cfg.target_layer_ids), embed, lm_head,
                                   derive_seed(seed, "drafter"), compile_dense=cfg.compile_dense)
        self.params: List[torch.nn.Parameter] = [p for p in self.drafter.parameters() if p.requires_grad]
        # One kernel for the whole update on a GPU (fused), one launch per op for all parameters elsewhere.
        on_gpu = device.type == "cuda"
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.0, fused=on_gpu or None,
                                           foreach=None if on_gpu else True)
        if state is not None:
            self.drafter.load_state_dict(state.drafter)
            self.optimizer.load_state_dict(state.optimizer)
        start = 0 if state is None else state.step
        self.anchor_generator = torch.Generator().manual_seed(derive_seed(seed, "anchors", index, start))

    def compute(self, batch: TargetBatch) -> torch.Tensor:
        """Forward and backward on one batch; gradients are left in .grad for averaging. Returns the loss as a
        device scalar: reading it waits for the GPU, so the loop reads it one step later."""
        self.optimizer.zero_grad(set_to_none=False)
        loss = drafter_loss(self.drafter, batch, self.cfg, self.anchor_generator, self.attention_path,
                            self.checkpoint)
        loss.backward()
        return loss.detach()

    def warm_up(self, seed: int) -> None:
        """One forward and backward on a synthetic batch, gradients thrown away: compiles this replica's graphs
        (the `warmup` mitigation) without moving its weights away from the other replicas'."""
        self.compute(synthetic_batch(self.cfg, self.device, seed))
        self.optimizer.zero_grad(set_to_none=False)

    def gradients(self) -> List[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]

    def set_gradients(self, grads: List[torch.Tensor]) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g.to(p.device)

    def apply(self) -> None:
        self.optimizer.step()

    def state(self, step: int) -> DrafterCheckpoint:
        return DrafterCheckpoint(step, self.drafter.state_dict(), self.optimizer.state_dict())

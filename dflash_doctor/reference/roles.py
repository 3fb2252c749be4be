"""What a target worker and a drafter worker do, independent of whether they run as threads or processes."""
from __future__ import annotations

import logging
import time
from typing import List, Optional

import torch

from dflash_doctor.reference.config import PipelineConfig
from dflash_doctor.reference.drafter import Drafter
from dflash_doctor.reference.target import Target, load_hf_target
from dflash_doctor.reference.training import TargetBatch, drafter_loss, pad_past_lengths, random_lengths


LOG = logging.getLogger("dflash_doctor.reference")


class InjectedFailure(RuntimeError):
    """Raised by the --fail-worker hook: a deliberate worker death, to exercise the clean shutdown."""


def target_dtype(device: torch.device):
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def build_target(cfg: PipelineConfig, device: torch.device, seed: int, hf_checkpoint: Optional[str] = None):
    """The frozen target; every worker builds the same weights from `seed` (or loads the same checkpoint)."""
    if hf_checkpoint:
        return load_hf_target(hf_checkpoint, cfg.target_layer_ids, device, target_dtype(device))
    generator = torch.Generator().manual_seed(seed)
    return Target(cfg.target, cfg.target_layer_ids, generator).to(device, target_dtype(device)).eval()


class TargetRole:
    """Writes a corpus of greedy continuations once, then serves batches: tokens, features and greedy labels."""

    def __init__(self, cfg: PipelineConfig, index: int, device: torch.device, seed: int,
                 hf_checkpoint: Optional[str] = None):
        self.cfg, self.device = cfg, device
        self.target = build_target(cfg, device, seed, hf_checkpoint)
        # Each worker its own prompts and sampling stream, the same model.
        self.generator = torch.Generator().manual_seed(seed * 7919 + index + 1)
        vocab = self.target.spec.vocab_size
        prompts = torch.randint(1, vocab - 1, (cfg.corpus_per_target, cfg.prompt_len), generator=self.generator)
        # Long startup work says what it is doing: greedy decoding is sequential, one token per forward.
        LOG.info("writing the corpus: %d greedy continuations, %d -> %d tokens", cfg.corpus_per_target,
                 cfg.prompt_len, cfg.seq_len)
        began = time.perf_counter()
        # One batch for the whole corpus: the decode loop's cost is per token, not per sequence.
        self.corpus = self.target.generate(prompts.to(device), cfg.seq_len)
        LOG.info("corpus ready in %.1f s", time.perf_counter() - began)

    def next_batch(self) -> TargetBatch:
        cfg = self.cfg
        rows = torch.randint(self.corpus.shape[0], (cfg.batch_size,), generator=self.generator)
        lengths = random_lengths(cfg, cfg.batch_size, self.generator)
        tokens = pad_past_lengths(self.corpus[rows.to(self.device)], lengths, cfg.pad_token_id)
        out = self.target(tokens)
        return TargetBatch(tokens, lengths.to(self.device), out.features, out.greedy)


def shared_heads(cfg: PipelineConfig, device: torch.device, seed: int, hf_checkpoint: Optional[str] = None):
    """The frozen target's embedding and LM head on a drafter's device (the drafter shares, never trains them)."""
    target = build_target(cfg, torch.device("cpu") if not hf_checkpoint else device, seed, hf_checkpoint)
    dtype = target_dtype(device)
    return target.embed.weight.detach().to(device, dtype), target.lm_head.weight.detach().to(device, dtype)


class DrafterRole:
    """One drafter replica with its AdamW; replicas start identical and apply the same averaged gradients."""

    def __init__(self, cfg: PipelineConfig, index: int, device: torch.device, seed: int, checkpoint: str,
                 attention_path: str, hf_checkpoint: Optional[str] = None, state: Optional[dict] = None):
        self.cfg, self.device, self.checkpoint, self.attention_path = cfg, device, checkpoint, attention_path
        self._stepped = False
        embed, lm_head = shared_heads(cfg, device, seed, hf_checkpoint)
        spec = cfg.target
        self.drafter = Drafter(spec, cfg.drafter_layers, len(cfg.target_layer_ids), embed, lm_head,
                               torch.Generator().manual_seed(seed + 1)).to(device)
        self.params: List[torch.nn.Parameter] = [p for p in self.drafter.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.0)
        if state is not None:
            self.drafter.load_state_dict(state["drafter"])
            self.optimizer.load_state_dict(state["optimizer"])
        start = 0 if state is None else int(state["step"])
        self.anchor_generator = torch.Generator().manual_seed(seed * 104729 + index * 1009 + start)

    def compute(self, batch: TargetBatch) -> float:
        """Forward and backward on one batch; gradients are left in .grad for averaging."""
        if not self._stepped:
            LOG.info("first step: compiling the attention forward and backward (a cold cache can take minutes)")
            self._stepped = True
        self.optimizer.zero_grad(set_to_none=False)
        loss = drafter_loss(self.drafter, batch, self.cfg, self.anchor_generator, self.attention_path,
                            self.checkpoint)
        loss.backward()
        return float(loss.detach())

    def gradients(self) -> List[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]

    def set_gradients(self, grads: List[torch.Tensor]) -> None:
        for p, g in zip(self.params, grads):
            p.grad = g.to(p.device)

    def apply(self) -> None:
        self.optimizer.step()

    def state(self, step: int) -> dict:
        return {"step": step, "drafter": self.drafter.state_dict(), "optimizer": self.optimizer.state_dict()}

"""One drafter training step's pieces: the batch a target worker hands over, and the drafter loss on it."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_doctor.reference import mask as masks
from dflash_doctor.reference.attention import attention_for
from dflash_doctor.reference.config import PipelineConfig
from dflash_doctor.reference.loss import block_labels, chunked_loss, loss_weights


@dataclass
class TargetBatch:
    tokens: torch.Tensor  # (batch, seq) ids, padding past each length
    lengths: torch.Tensor  # (batch,)
    features: torch.Tensor  # (batch, seq, F * hidden)
    greedy: torch.Tensor  # (batch, seq)

    def to(self, device) -> "TargetBatch":
        return TargetBatch(*(t.to(device, non_blocking=True) for t in
                             (self.tokens, self.lengths, self.features, self.greedy)))

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum())


def random_lengths(cfg: PipelineConfig, batch: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(cfg.min_len, cfg.seq_len + 1, (batch,), generator=generator)


def pad_past_lengths(tokens: torch.Tensor, lengths: torch.Tensor, pad_id: int) -> torch.Tensor:
    past = torch.arange(tokens.shape[1], device=tokens.device)[None, :] >= lengths.to(tokens.device)[:, None]
    return tokens.masked_fill(past, pad_id)


def autocast_for(device: torch.device):
    """bf16 autocast on CUDA (fp32 master weights); a no-op context on CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast(
        "cpu", enabled=False)


def drafter_loss(drafter, batch: TargetBatch, cfg: PipelineConfig, anchor_generator: torch.Generator,
                 attention_path: str, checkpoint: str) -> torch.Tensor:
    """Sample anchors, build this step's mask, run the drafter and return the weighted chunked loss."""
    device = batch.tokens.device
    block = cfg.block_size
    anchors = masks.sample_anchors(batch.lengths.cpu(), cfg.prompt_len, block, cfg.blocks_per_seq,
                                   anchor_generator).to(device)
    attend = attention_for(attention_path, anchors, batch.tokens.shape[1], block)
    ids = masks.block_inputs(batch.tokens, anchors, block, cfg.mask_token_id)
    with autocast_for(device):
        hidden = drafter(batch.features, ids, masks.block_positions(anchors, block), attend)
        labels = block_labels(batch.greedy, anchors, block)
        weights = loss_weights(anchors, batch.lengths, block, cfg.loss_decay)
        return chunked_loss(hidden, drafter.norm, drafter.shared["lm_head"], labels, weights, cfg.loss_chunk,
                            checkpoint)

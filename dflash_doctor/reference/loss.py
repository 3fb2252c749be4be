"""Position-decayed, chunked cross-entropy: full (queries x vocab) logits are never materialised at once.

Block position k (1..B-1) predicts the target's greedy token for position anchor + k, i.e. the target's own
prediction made at anchor + k - 1. Position 0 is the anchor (given, weight 0); padded blocks and labels past the
sequence end weigh 0; the rest weigh exp(-(k-1)/gamma), because early positions decide how many drafted tokens
are accepted.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_doctor.reference.config import CHECKPOINT_MODES
from dflash_doctor.reference.dense_compile import compiled
from dflash_doctor.reference.layers import rms_norm


def position_weights(block_size: int, decay: float, device=None) -> torch.Tensor:
    """(B,) weights by position inside a block: 0 for the anchor, exp(-(k-1)/decay) for k >= 1. Made on `device`
    directly: a host-to-device copy of a pageable tensor would wait for every kernel queued before it."""
    k = torch.arange(block_size, dtype=torch.float32, device=device)
    return torch.exp(-(k - 1) / decay) * (k > 0)


def loss_weights(anchors: torch.Tensor, lengths: torch.Tensor, block_size: int, decay: float) -> torch.Tensor:
    """(batch, blocks * B) weight of every query row; `lengths` on the anchors' device."""
    k = torch.arange(block_size, device=anchors.device)
    label_pos = anchors[..., None] + k
    real = (anchors[..., None] >= 0) & (label_pos < lengths[:, None, None])
    weights = position_weights(block_size, decay, anchors.device) * real
    return weights.flatten(1)


def block_labels(greedy: torch.Tensor, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """(batch, blocks * B) label ids: the target's greedy token made at anchor + k - 1 (anchor rows: ignored)."""
    k = torch.arange(block_size, device=anchors.device)
    source = (anchors[..., None] + k - 1).clamp(0, greedy.shape[1] - 1)
    return greedy.gather(1, source.flatten(1))


def _chunk_loss(hidden, norm_weight, eps, lm_head_weight, labels, weights):
    logits = F.linear(rms_norm(hidden, norm_weight, eps), lm_head_weight).float()
    return (F.cross_entropy(logits, labels, reduction="none") * weights).sum()


def chunked_loss(hidden: torch.Tensor, norm, lm_head_weight: torch.Tensor, labels: torch.Tensor,
                 weights: torch.Tensor, chunk: int, checkpoint: str, compile_dense: bool = False) -> torch.Tensor:
    """Weighted mean CE over query rows; each chunk of rows recomputes its logits in backward when checkpointed.

    `checkpoint`: "reentrant" (use_reentrant=True), "non-reentrant" (use_reentrant=False) or "none". The seeds
    toggled exactly this; checkpointing only applies when autograd records (a no-grad replay has nothing to save).
    `compile_dense`: each chunk's norm, head and cross-entropy as one compiled graph (reference/dense_compile.py).
    """
    if checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint must be one of {CHECKPOINT_MODES}, not {checkpoint!r}")
    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    rows = hidden.reshape(-1, hidden.shape[-1])
    labels, weights = labels.reshape(-1), weights.reshape(-1).to(rows.device)
    recording = torch.is_grad_enabled() and rows.requires_grad
    total = rows.new_zeros((), dtype=torch.float32)
    chunk_loss = compiled(_chunk_loss) if compile_dense else _chunk_loss
    for start in range(0, rows.shape[0], chunk):
        part = (rows[start:start + chunk], norm.weight, norm.eps, lm_head_weight,
                labels[start:start + chunk], weights[start:start + chunk])
        if checkpoint == "none" or not recording:
            total = total + chunk_loss(*part)
        else:
            total = total + torch_checkpoint(chunk_loss, *part, use_reentrant=checkpoint == "reentrant")
    return total / weights.sum().clamp_min(1e-6)

"""One drafter training step, callable again and again: what `repro` replays in each of its threads.

Contract (the repro harness codes against it):

    step = build_drafter_step(preset="tiny", device="cpu", checkpoint="none", shape_index=0, backward=None, seed=0)
    loss = step.run()        # BlockMask build, drafter forward through compiled flex_attention, loss, backward
    step.device, step.shape  # torch.device; (batch, seq_len, blocks, block_size)

`shape_index` picks a distinct (seq_len, blocks) so threads with different indices make Dynamo compile distinct
static shapes (`torch.compile(flex_attention, dynamic=False)`). `backward` defaults to True on CUDA and False
elsewhere (flex_attention has no CPU backward); without backward the step runs under no_grad.

No torch.compile wrapper is created by importing this module or by `build_drafter_step`: the one wrapper is made
by `compiled_flex_attention()` on the first `run()` (or by a caller that warms it), so a mitigation that swaps
Dynamo's FX-tracing predicate can be installed first.
"""
from __future__ import annotations

from typing import Optional, Tuple

__all__ = ["DrafterStep", "build_drafter_step", "compiled_flex_attention"]


def compiled_flex_attention():
    """The process-wide `torch.compile(flex_attention, dynamic=False)` wrapper every step uses, made on first call.

    Call it to create (and then warm) the wrapper after installing a mitigation.
    """
    from dflash_doctor.reference import attention

    return attention.compiled_flex_attention()


class DrafterStep:
    """A drafter, an optimizer and one fixed target batch on one device; `run()` is one training step."""

    def __init__(self, drafter, optimizer, batch, cfg, anchor_generator, checkpoint: str, backward: bool):
        self.drafter = drafter
        self.optimizer = optimizer
        self.batch = batch
        self.cfg = cfg
        self.anchor_generator = anchor_generator
        self.checkpoint = checkpoint
        self.backward = backward
        self.device = batch.tokens.device
        self.shape: Tuple[int, int, int, int] = (
            int(batch.tokens.shape[0]), int(batch.tokens.shape[1]), cfg.blocks_per_seq, cfg.block_size)

    def run(self) -> float:
        import torch

        from dflash_doctor.reference.attention import FlexAttention
        from dflash_doctor.reference.training import drafter_loss

        with torch.set_grad_enabled(self.backward):
            loss = drafter_loss(self.drafter, self.batch, self.cfg, self.anchor_generator, FlexAttention.name,
                                self.checkpoint)
            if self.backward:
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
        return float(loss.detach())


def build_drafter_step(preset: str = "tiny", device: str = "cpu", checkpoint: str = "none", shape_index: int = 0,
                       backward: Optional[bool] = None, seed: int = 0) -> DrafterStep:
    """Build (but do not run) one replayable drafter step; see the module docstring for the contract."""
    from dflash_doctor.errors import require_torch

    torch = require_torch("replaying a drafter step")
    from dflash_doctor.reference.config import CHECKPOINT_MODES
    from dflash_doctor.reference.config import preset as preset_config
    from dflash_doctor.reference.drafter import Drafter
    from dflash_doctor.reference.layers import derive_seed
    from dflash_doctor.reference.roles import target_dtype
    from dflash_doctor.reference.target import build_target
    from dflash_doctor.reference.training import TargetBatch, pad_past_lengths, random_lengths

    if checkpoint not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint must be one of {CHECKPOINT_MODES}, not {checkpoint!r}")
    cfg = preset_config(preset).with_shape_index(shape_index)
    dev = torch.device(device)
    if backward is None:
        backward = dev.type == "cuda"
    target = build_target(cfg.target, cfg.target_layer_ids, seed, dev, target_dtype(dev))
    with torch.device(dev):
        drafter = Drafter(cfg.target, cfg.drafter_layers, len(cfg.target_layer_ids), target.embed.weight,
                          target.lm_head.weight, derive_seed(seed, "drafter"))
    generator = torch.Generator().manual_seed(derive_seed(seed, "replay-batch"))
    lengths = random_lengths(cfg, cfg.batch_size, generator)
    tokens = torch.randint(1, cfg.mask_token_id, (cfg.batch_size, cfg.seq_len), generator=generator)
    tokens = pad_past_lengths(tokens, lengths, cfg.pad_token_id).to(dev)
    out = target(tokens)
    batch = TargetBatch(tokens, lengths.to(dev), out.features, out.greedy, lengths)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr) if backward else None
    return DrafterStep(drafter, optimizer, batch, cfg, generator, checkpoint, backward)

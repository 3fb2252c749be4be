"""Sizes of the reference pipeline: one frozen dataclass per model, one per run, and the named presets.

Plain data: importing this module never imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple

from dflash_doctor.vocabularies import Checkpoint


CHECKPOINT_MODES = tuple(mode.value for mode in Checkpoint)


@dataclass(frozen=True)
class ModelSpec:
    """A Qwen3-style decoder: RMSNorm, q/k norm, GQA, RoPE, SwiGLU."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 1_000_000.0
    norm_eps: float = 1e-6

    def linear_params_per_layer(self) -> int:
        d, hd = self.hidden_size, self.head_dim
        attention = d * hd * (2 * self.num_heads + 2 * self.num_kv_heads)  # q, o + k, v
        return attention + 3 * d * self.intermediate_size  # gate, up, down


@dataclass(frozen=True)
class PipelineConfig:
    name: str
    target: ModelSpec
    drafter_layers: int
    target_layer_ids: Tuple[int, ...]  # target layers whose outputs the drafter reads as context
    block_size: int  # B: [anchor, MASK x (B-1)]
    seq_len: int
    prompt_len: int  # random prompt; the rest of each sequence is the target's greedy continuation
    min_len: int  # sequences are cut to a random length in [min_len, seq_len]; the rest is padding
    blocks_per_seq: int  # anchors sampled per sequence and step
    batch_size: int  # sequences per drafter step (per drafter worker)
    loss_decay: float  # gamma: weight of block position k is exp(-(k-1)/gamma)
    loss_chunk: int  # query rows per checkpointed loss chunk
    lr: float
    steps: int
    target_workers: int
    drafter_workers: int
    corpus_size: int  # greedy sequences written once in set-up and shared by every target worker
    # Drafters that share a device each draft one more block per sequence than the one before, so each compiles
    # a graph of its own, as the seeds' drafters did on GPUs of their own (on one GPU they would share one).
    distinct_drafter_shapes: bool = False
    queue_depth: int = 2
    log_every: int = 1
    # The drafter's norms, projections, MLP and loss chunks compiled whole, flex_attention still its own compiled
    # call (reference/dense_compile.py): the throughput presets. Off where the incident is reproduced, whose
    # drafter compiled flex_attention alone.
    compile_dense: bool = False

    @property
    def mask_token_id(self) -> int:
        return self.target.vocab_size - 1

    @property
    def pad_token_id(self) -> int:
        return 0

    def with_extra_blocks(self, extra: int) -> "PipelineConfig":
        """The same run with `extra` more blocks per sequence: a distinct static shape for one drafter."""
        return replace(self, blocks_per_seq=self.blocks_per_seq + extra)

    def with_shape_index(self, shape_index: int) -> "PipelineConfig":
        """A distinct (seq_len, blocks) per index, so each index is a distinct shape for a static compile."""
        if shape_index < 0:
            raise ValueError("shape_index must be >= 0")
        step = 2 * self.block_size
        return replace(
            self,
            seq_len=self.seq_len + step * shape_index,
            min_len=self.min_len + step * shape_index,
            blocks_per_seq=self.blocks_per_seq + shape_index,
        )


TINY = PipelineConfig(
    name="tiny",
    target=ModelSpec(vocab_size=128, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                     intermediate_size=128),
    drafter_layers=1,
    target_layer_ids=(1, 3),
    block_size=4,
    seq_len=64,
    prompt_len=8,
    min_len=48,
    blocks_per_seq=8,
    batch_size=16,
    loss_decay=4.0,
    loss_chunk=64,
    lr=1e-2,
    steps=30,
    target_workers=1,
    drafter_workers=2,
    corpus_size=64,
)

# One H200: a drafter step of ~7 TFLOP (bf16) is GPU-bound, and the model still compiles in well under a minute.
SMALL = PipelineConfig(
    name="small",
    target=ModelSpec(vocab_size=32768, hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8, head_dim=64,
                     intermediate_size=3072),
    drafter_layers=2,
    target_layer_ids=(1, 4, 7),
    block_size=16,
    seq_len=2048,
    prompt_len=256,
    min_len=1536,
    blocks_per_seq=64,
    batch_size=16,
    loss_decay=7.0,
    loss_chunk=4096,
    lr=3e-4,
    steps=40,
    target_workers=1,
    drafter_workers=1,
    corpus_size=32,
    compile_dense=True,
)

# What `repro` replays by default: the smallest drafter whose compiled flex_attention takes the kernel real
# training shapes take (>= 128 query rows: 8 blocks of 16), with the loop's head size (4 heads of 64). Below 128
# rows flex_attention uses its decoding kernel, whose first call took over a second on the H200: long enough for
# the other threads' compiles to finish before the first backward, which hid the deadlock (docs/races.md).
REPLAY = PipelineConfig(
    name="replay",
    target=ModelSpec(vocab_size=512, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64,
                     intermediate_size=512),
    drafter_layers=1,
    target_layer_ids=(0, 1),
    block_size=16,
    seq_len=256,
    prompt_len=16,
    min_len=224,
    blocks_per_seq=8,
    batch_size=2,
    loss_decay=7.0,
    loss_chunk=4096,
    lr=1e-3,
    steps=30,
    target_workers=1,
    drafter_workers=3,
    corpus_size=8,
)

# The seeds' topology: 5 target workers and 3 drafter workers (scaled onto the devices present), one corpus.
SEEDS = replace(SMALL, name="seeds", target_workers=5, drafter_workers=3, batch_size=8, corpus_size=32,
                distinct_drafter_shapes=True, compile_dense=False)

PRESETS = {c.name: c for c in (TINY, SMALL, SEEDS, REPLAY)}


def preset(name: str) -> PipelineConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None

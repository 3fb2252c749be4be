"""The drafter's attention, two interchangeable paths over the same mask_mod.

- `FlexAttention`: `torch.compile(flex_attention, dynamic=False)` with this step's BlockMask. The GPU path,
  forward and backward. On a CPU the forward compiles and runs, but flex_attention has no CPU backward.
- `DenseAttention`: SDPA with the dense boolean form of the same mask. The CPU training path (CI).

No compile wrapper exists until `compiled_flex_attention()` is first called: the wrapper binds Dynamo's
FX-tracing predicate when it is created, so a mitigation that swaps that predicate must run first.
"""
from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from dflash_doctor.reference import mask as masks

_compiled = None
_compiled_lock = threading.Lock()


def compiled_flex_attention():
    """The process-wide `torch.compile(flex_attention, dynamic=False)` wrapper, created on first use."""
    global _compiled
    with _compiled_lock:
        if _compiled is None:
            from torch.nn.attention.flex_attention import flex_attention

            _compiled = torch.compile(flex_attention, dynamic=False)
        return _compiled


class FlexAttention:
    name = "flex"

    def __init__(self, anchors: torch.Tensor, ctx_len: int, block_size: int):
        self.block_mask = masks.block_mask_for(anchors, ctx_len, block_size, anchors.device)

    def __call__(self, q, k, v):
        return compiled_flex_attention()(q, k, v, block_mask=self.block_mask, enable_gqa=True)


class DenseAttention:
    name = "sdpa-dense"

    def __init__(self, anchors: torch.Tensor, ctx_len: int, block_size: int):
        self.mask = masks.dense_mask_for(anchors, ctx_len, block_size)
        # SDPA turns a row with nothing visible into NaN; flex_attention returns 0 there. Let such rows see
        # everything (finite) and zero them afterwards, so both paths agree and no NaN reaches the gradient.
        self.empty_rows = ~self.mask.any(-1, keepdim=True)
        self.safe_mask = self.mask | self.empty_rows

    def __call__(self, q, k, v):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.safe_mask, enable_gqa=True)
        return out.masked_fill(self.empty_rows, 0.0)


ATTENTION_PATHS = {FlexAttention.name: FlexAttention, DenseAttention.name: DenseAttention}


def attention_for(path: str, anchors: torch.Tensor, ctx_len: int, block_size: int):
    try:
        return ATTENTION_PATHS[path](anchors, ctx_len, block_size)
    except KeyError:
        raise ValueError(f"attention path must be one of {sorted(ATTENTION_PATHS)}, not {path!r}") from None


def default_path(device: torch.device, backward: bool) -> str:
    """flex everywhere it can train; SDPA-dense only where a backward is needed and flex has none (CPU)."""
    return DenseAttention.name if backward and device.type == "cpu" else FlexAttention.name

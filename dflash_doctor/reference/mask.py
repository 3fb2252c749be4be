"""The DFlash training mask: anchors sampled per step, a mask_mod over them, and its BlockMask / dense forms.

Query row q belongs to block q // B of its sequence; key/value column kv is either a context position
(kv < ctx_len: the target's hidden state at that position) or a block token (kv - ctx_len). A block sees the
context strictly before its anchor and its own B tokens in both directions; padded blocks (anchor -1) see nothing.
"""
from __future__ import annotations

import torch

PAD_ANCHOR = -1


def sample_anchors(lengths: torch.Tensor, prompt_len: int, block_size: int, blocks: int,
                   generator: torch.Generator) -> torch.Tensor:
    """(batch, blocks) sorted distinct anchors in [max(1, prompt_len), length - B], PAD_ANCHOR where none fit.

    Anchors start in the response (the target's greedy continuation) so every label is predictable, and end B
    tokens before the sequence end so every block's labels are real tokens.
    """
    rows = []
    for length in lengths.tolist():
        low, high = max(1, prompt_len), int(length) - block_size
        candidates = max(0, high - low + 1)
        take = min(blocks, candidates)
        picked = low + torch.randperm(candidates, generator=generator)[:take].sort().values
        rows.append(torch.cat([picked, torch.full((blocks - take,), PAD_ANCHOR, dtype=torch.long)]))
    return torch.stack(rows)


def dflash_mask_mod(anchors: torch.Tensor, ctx_len: int, block_size: int):
    """mask_mod(b, h, q_idx, kv_idx) for flex_attention, closed over this step's anchors (batch, blocks)."""

    last_block = anchors.shape[1] - 1

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = q_idx // block_size
        # Compiled kernels may also evaluate the rows that pad Q_LEN up to a tile: clamp so those never index
        # past the end of `anchors`.
        anchor = anchors[b, q_block.clamp(max=last_block)]
        in_context = kv_idx < ctx_len
        sees_context = in_context & (kv_idx < anchor)
        sees_own_block = (~in_context) & ((kv_idx - ctx_len) // block_size == q_block)
        return (anchor >= 0) & (sees_context | sees_own_block)

    return mask_mod


def block_mask_for(anchors: torch.Tensor, ctx_len: int, block_size: int, device):
    """The per-step BlockMask (create_block_mask over the mask_mod); anchors must already be on `device`."""
    from torch.nn.attention.flex_attention import create_block_mask

    batch, blocks = anchors.shape
    queries = blocks * block_size
    return create_block_mask(dflash_mask_mod(anchors, ctx_len, block_size), B=batch, H=None, Q_LEN=queries,
                             KV_LEN=ctx_len + queries, device=device)


def dense_mask_for(anchors: torch.Tensor, ctx_len: int, block_size: int) -> torch.Tensor:
    """The same mask as a dense bool (batch, 1, queries, ctx_len + queries), by broadcasting the mask_mod."""
    batch, blocks = anchors.shape
    queries = blocks * block_size
    device = anchors.device
    b = torch.arange(batch, device=device)[:, None, None, None]
    q_idx = torch.arange(queries, device=device)[None, None, :, None]
    kv_idx = torch.arange(ctx_len + queries, device=device)[None, None, None, :]
    return dflash_mask_mod(anchors, ctx_len, block_size)(b, None, q_idx, kv_idx)


def block_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """(batch, blocks * B) RoPE positions of the block tokens: anchor + k (padded blocks sit at 0)."""
    offsets = torch.arange(block_size, device=anchors.device)
    return (anchors.clamp_min(0)[..., None] + offsets).flatten(1)


def block_inputs(tokens: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int) -> torch.Tensor:
    """(batch, blocks * B) drafter input ids: [anchor token, MASK x (B-1)] per block."""
    anchor_tokens = tokens.gather(1, anchors.clamp_min(0))
    ids = torch.full((*anchors.shape, block_size), mask_token_id, dtype=tokens.dtype, device=tokens.device)
    ids[..., 0] = anchor_tokens
    return ids.flatten(1)

"""Model FLOPs per trained sequence token and model FLOP utilisation (MFU), by the usual 2N / 6N counting.

Per sequence token: the target's forward (2 x linear params, LM head included for the greedy labels, plus causal
attention), and the drafter's training step (6 x: per query row its layers and the LM head; per context position
`fc` and each layer's context K/V projections; attention over the context before the anchor plus the block).
Approximate by design: a yardstick to compare runs with, not a profiler.
"""
from __future__ import annotations

from typing import Optional

from dflash_doctor.reference.config import PipelineConfig

# Dense bf16 peak per device, from the vendors' datasheets (no sparsity).
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "B200": 2250e12}


def flops_per_token(cfg: PipelineConfig, blocks_per_seq: Optional[float] = None) -> float:
    """`blocks_per_seq`: the drafters' mean, when drafters sharing a device draft different numbers of blocks."""
    t = cfg.target
    mean_len = (cfg.min_len + cfg.seq_len) / 2
    attn_width = t.num_heads * t.head_dim
    target = 2.0 * (t.num_layers * t.linear_params_per_layer() + t.hidden_size * t.vocab_size)
    target += t.num_layers * 2 * 2 * (mean_len / 2) * attn_width  # QK^T and AV over half the sequence (causal)
    blocks = cfg.blocks_per_seq if blocks_per_seq is None else blocks_per_seq
    queries_per_token = blocks * cfg.block_size / mean_len
    per_query = cfg.drafter_layers * t.linear_params_per_layer() + t.hidden_size * t.vocab_size
    per_query_attention = cfg.drafter_layers * 2 * 2 * (mean_len / 2 + cfg.block_size) * attn_width
    per_context = len(cfg.target_layer_ids) * t.hidden_size * t.hidden_size
    per_context += cfg.drafter_layers * 2 * t.hidden_size * t.num_kv_heads * t.head_dim
    drafter = 6 * (queries_per_token * per_query + per_context) + 3 * queries_per_token * per_query_attention
    return float(target + drafter)


def peak_flops(device_name: str) -> Optional[float]:
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return peak
    return None


def mfu(flops: float, tokens_per_s: Optional[float], device_names) -> Optional[float]:
    """Achieved model FLOP/s (`flops` per token) over the summed peak of the distinct devices used; None if any
    peak is unknown."""
    names = list(device_names)
    peaks = [peak_flops(n) for n in names]
    if tokens_per_s is None or not names or any(p is None for p in peaks):
        return None
    return flops * tokens_per_s / sum(p for p in peaks if p is not None)

"""Qwen3-style building blocks shared by the target and the drafter: RMSNorm, RoPE, SwiGLU, q/k/v projections."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dflash_doctor.reference.config import ModelSpec


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 so bf16 activations on the GPU do not lose the mean square.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """cos, sin of shape positions.shape + (head_dim,) for the rotate-half RoPE convention."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, heads, n, head_dim); cos/sin: (batch, n, head_dim)."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class QKV(nn.Module):
    """Q, K, V projections with Qwen3's per-head q/k RMSNorm; heads first: (batch, heads, n, head_dim)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        d, hd = spec.hidden_size, spec.head_dim
        self.spec = spec
        self.q_proj = nn.Linear(d, spec.num_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, spec.num_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, spec.num_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(spec.num_heads * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, spec.norm_eps)
        self.k_norm = RMSNorm(hd, spec.norm_eps)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, heads, self.spec.head_dim).transpose(1, 2)

    def query(self, x, cos, sin):
        return apply_rope(self.q_norm(self._heads(self.q_proj(x), self.spec.num_heads)), cos, sin)

    def key_value(self, x, cos, sin):
        k = apply_rope(self.k_norm(self._heads(self.k_proj(x), self.spec.num_kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(x), self.spec.num_kv_heads)

    def output(self, attn: torch.Tensor) -> torch.Tensor:
        b, _, n, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, n, -1))


def init_weights(module: nn.Module, generator=None, std: float = 0.02) -> None:
    """Normal init from `generator`, so building a model never touches the process-wide RNG other threads use."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std, generator=generator)

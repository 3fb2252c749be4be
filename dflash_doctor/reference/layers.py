"""Qwen3-style building blocks shared by the target and the drafter: RMSNorm, RoPE, SwiGLU, q/k/v projections.

Written for few kernels per call: on a GPU the reference pipeline runs thousands of these a second, and every
extra elementwise pass over a (tokens x hidden) tensor is memory traffic the matmuls do not hide.
"""
from __future__ import annotations

import hashlib
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from dflash_doctor.reference.config import ModelSpec

SEED_MODULUS = 2 ** 63


def derive_seed(seed: int, *labels: object) -> int:
    """A stable seed for one named stream (a weight, a worker's sampling), independent of every other stream, so
    any worker can rebuild exactly the tensors it needs without replaying the others' random draws."""
    digest = hashlib.blake2b(":".join(map(str, (seed,) + labels)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_MODULUS


def generator_for(device: torch.device, seed: int) -> torch.Generator:
    """A generator on `device`: initialising GPU weights on the GPU takes milliseconds instead of seconds."""
    return torch.Generator(device=device).manual_seed(seed)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with fp32 statistics, in x's dtype: one fused kernel where torch has one (CUDA), and the same
    arithmetic as the upcast formula where it has not. Under autocast torch may run it in fp32; the result is
    still handed back in x's dtype so bf16 activations stay bf16."""
    return F.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


Rope = Tuple[torch.Tensor, torch.Tensor]  # cos, sin: (batch, n, 1, head_dim), already in the activations' dtype


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: Optional[torch.dtype] = None) -> Rope:
    """cos, sin for the rotate-half RoPE convention, shaped (batch, n, 1, head_dim) to broadcast over heads of a
    (batch, n, heads, head_dim) tensor; computed once per forward and cast once, not in every layer."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, :, None, :]
    cos, sin = angles.cos(), angles.sin()
    return (cos, sin) if dtype is None else (cos.to(dtype), sin.to(dtype))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (batch, n, heads, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class QKV(nn.Module):
    """Q, K, V projections with Qwen3's per-head q/k RMSNorm. Norm and RoPE work on (batch, n, heads, head_dim),
    the layout the projection writes; only the attention call sees heads first, as a transposed view."""

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

    def _split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, heads, self.spec.head_dim)

    def query(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        """(batch, heads, n, head_dim)."""
        return apply_rope(self.q_norm(self._split(self.q_proj(x), self.spec.num_heads)), *rope).transpose(1, 2)

    def key_value(self, x: torch.Tensor, rope: Rope) -> Tuple[torch.Tensor, torch.Tensor]:
        """Each (batch, kv_heads, n, head_dim)."""
        k = apply_rope(self.k_norm(self._split(self.k_proj(x), self.spec.num_kv_heads)), *rope)
        return k.transpose(1, 2), self._split(self.v_proj(x), self.spec.num_kv_heads).transpose(1, 2)

    def output(self, attn: torch.Tensor) -> torch.Tensor:
        b, _, n, _ = attn.shape
        return self.o_proj(attn.transpose(1, 2).reshape(b, n, -1))


def init_weights(module: nn.Module, seed: int, std: float = 0.02, stds: Optional[dict] = None) -> None:
    """Normal init of every Linear/Embedding weight, each from its own stream `derive_seed(seed, name)`, on the
    weight's own device: a worker that needs only some of the tensors (the drafter, only the target's embedding and
    head) builds them identical to the whole model's. `stds` overrides the deviation per parameter name."""
    stds = stds or {}
    with torch.no_grad():
        for name, m in module.named_modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                weight = m.weight
                weight.normal_(0.0, stds.get(name, std), generator=generator_for(weight.device,
                                                                                 derive_seed(seed, name)))

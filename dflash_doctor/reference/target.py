"""The frozen target: a small Qwen3-style decoder, random by default, or a local Hugging Face checkpoint.

It gives the drafter two things per sequence: the hidden states of chosen layers (the drafter's context) and
its own greedy next tokens (the drafter's labels). corpus.py uses its layers to write the training data.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from dflash_doctor.reference.config import ModelSpec
from dflash_doctor.reference.dense_compile import compiled
from dflash_doctor.reference.layers import QKV, RMSNorm, Rope, SwiGLU, init_weights, rope_cos_sin


@dataclass
class TargetOutput:
    features: torch.Tensor  # (batch, seq, len(layer_ids) * hidden): chosen layers' outputs, concatenated
    greedy: torch.Tensor  # (batch, seq): argmax next token after each position


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.input_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.attn = QKV(spec)
        self.post_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mlp = SwiGLU(spec.hidden_size, spec.intermediate_size)

    def forward(self, x: torch.Tensor, rope: Rope) -> torch.Tensor:
        """Causal self-attention over the whole sequence."""
        h = self.input_norm(x)
        k, v = self.attn.key_value(h, rope)
        out = F.scaled_dot_product_attention(self.attn.query(h, rope), k, v, is_causal=True, enable_gqa=True)
        return self.residual_mlp(x, out)

    def residual_mlp(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + self.attn.output(attn_out)
        return x + self.mlp(self.post_norm(x))


def head_stds(spec: ModelSpec) -> dict:
    """A larger embedding makes a random decoder's greedy choice lean on the current token (a task a one-layer
    drafter learns in a few dozen steps), and a larger head gives peaked logits (std ~3) like a trained LM's, which
    the drafter, sharing the head, needs to express confident predictions."""
    return {"embed": 1.0, "lm_head": 3.0 / spec.hidden_size ** 0.5}


class TargetHeads(nn.Module):
    """The target's embedding and LM head alone, initialised exactly as in the whole target (same names, same
    seeds): what a drafter worker needs of the target, without building its layers."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)


class Target(nn.Module):
    def __init__(self, spec: ModelSpec, layer_ids: Sequence[int]):
        super().__init__()
        if not layer_ids or max(layer_ids) >= spec.num_layers or min(layer_ids) < 0:
            raise ValueError(f"target layer ids {tuple(layer_ids)} outside 0..{spec.num_layers - 1}")
        self.spec = spec
        self.layer_ids = tuple(layer_ids)
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers: Sequence[DecoderLayer] = nn.ModuleList(  # type: ignore[assignment]
            DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        # Each layer one compiled graph (reference/dense_compile.py): set by the set-up of the throughput presets,
        # whose first forward, the capture's warm-up, compiles it in the main thread before any worker exists.
        self.compile_layers = False

    def greedy(self, hidden: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        # Chunked over positions so (seq x vocab) logits never exist at once.
        return torch.cat([self.lm_head(self.norm(part)).argmax(-1) for part in hidden.split(chunk, dim=1)], dim=1)

    def rope(self, positions: torch.Tensor) -> Rope:
        return rope_cos_sin(positions, self.spec.head_dim, self.spec.rope_theta, self.embed.weight.dtype)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> TargetOutput:
        pos = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        rope = self.rope(pos)
        x = self.embed(tokens)
        features = []
        # One graph for every layer: the layers are alike, so Dynamo reuses it (the weights are its inputs).
        forward = compiled(DecoderLayer.forward) if self.compile_layers else DecoderLayer.forward
        for i, layer in enumerate(self.layers):
            x = forward(layer, x, rope)
            if i in self.layer_ids:
                features.append(x)
        return TargetOutput(features=torch.cat(features, dim=-1), greedy=self.greedy(x))


M = TypeVar("M", bound=nn.Module)


def _materialise(module: M, device: torch.device, seed: int, stds: dict) -> M:
    """Allocate a module built on the meta device directly on `device` and initialise it there (norms to one,
    matrices from their named seeds): no CPU copy, no default init thrown away."""
    module.to_empty(device=device)
    init_weights(module, seed, stds=stds)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, RMSNorm):
                sub.weight.fill_(1.0)
    return module


def build_target(spec: ModelSpec, layer_ids: Sequence[int], seed: int, device: torch.device,
                 dtype: torch.dtype) -> Target:
    """The frozen random target: the same weights for a given seed in every worker on the same kind of device."""
    with torch.device("meta"):
        target = Target(spec, layer_ids)
    _materialise(target, device, seed, head_stds(spec))
    target.to(dtype).requires_grad_(False).eval()
    return target


def build_target_heads(spec: ModelSpec, seed: int, device: torch.device, dtype: torch.dtype) -> TargetHeads:
    with torch.device("meta"):
        heads = TargetHeads(spec)
    _materialise(heads, device, seed, head_stds(spec))
    heads.to(dtype).requires_grad_(False)
    return heads


class HFTarget(nn.Module):
    """A local Hugging Face causal LM behind the same interface (features of chosen layers, greedy tokens)."""

    def __init__(self, model, layer_ids: Sequence[int]):
        super().__init__()
        self.model = model
        self.layer_ids = tuple(layer_ids)
        cfg = model.config
        self.spec = ModelSpec(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads, num_kv_heads=getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
            intermediate_size=cfg.intermediate_size,
        )
        self.embed = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        self.requires_grad_(False)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> TargetOutput:
        out = self.model(input_ids=tokens, output_hidden_states=True)
        # hidden_states[0] is the embedding output, so layer i's output is hidden_states[i + 1].
        features = torch.cat([out.hidden_states[i + 1] for i in self.layer_ids], dim=-1)
        return TargetOutput(features=features, greedy=out.logits.argmax(-1))

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, total_len: int) -> torch.Tensor:
        return self.model.generate(prompt, max_length=total_len, min_length=total_len, do_sample=False)


def load_hf_target(path: str, layer_ids: Sequence[int], device, dtype) -> HFTarget:
    """Load a local checkpoint folder (never downloads); raises ValueError with one clear line otherwise."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{path} is not a local Hugging Face checkpoint (no config.json in it)")
    from dflash_doctor.errors import require

    transformers = require("transformers", package="transformers", install="pip install transformers",
                           purpose="--target-checkpoint")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, torch_dtype=dtype)
    return HFTarget(model.to(device).eval(), layer_ids)

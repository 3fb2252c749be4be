"""The frozen target: a small Qwen3-style decoder, random by default, or a local Hugging Face checkpoint.

It gives the drafter two things per sequence: the hidden states of chosen layers (the drafter's context) and
its own greedy next tokens (the drafter's labels). It also writes the training data: random prompts continued
greedily, so the drafter's task (predict the target's greedy tokens) is learnable.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dflash_doctor.reference.config import ModelSpec
from dflash_doctor.reference.layers import QKV, RMSNorm, SwiGLU, init_weights, rope_cos_sin


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

    def forward(self, x, rope, cache=None, start: int = 0):
        h = self.input_norm(x)
        q = self.attn.query(h, *rope)
        k, v = self.attn.key_value(h, *rope)
        if cache is not None:  # incremental decoding: write this step's K/V, attend over everything so far
            cache[0][:, :, start:start + k.shape[2]] = k
            cache[1][:, :, start:start + k.shape[2]] = v
            k, v = cache[0][:, :, :start + k.shape[2]], cache[1][:, :, :start + k.shape[2]]
        causal = cache is None or q.shape[2] > 1
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        x = x + self.attn.output(out)
        return x + self.mlp(self.post_norm(x))


class Target(nn.Module):
    def __init__(self, spec: ModelSpec, layer_ids: Sequence[int], generator=None):
        super().__init__()
        if not layer_ids or max(layer_ids) >= spec.num_layers or min(layer_ids) < 0:
            raise ValueError(f"target layer ids {tuple(layer_ids)} outside 0..{spec.num_layers - 1}")
        self.spec = spec
        self.layer_ids = tuple(layer_ids)
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        init_weights(self, generator)
        # A larger embedding makes a random decoder's greedy choice lean on the current token (a task a one-layer
        # drafter learns in a few dozen steps), and a larger head gives peaked logits (std ~3) like a trained LM's,
        # which the drafter, sharing the head, needs to express confident predictions.
        nn.init.normal_(self.embed.weight, std=1.0, generator=generator)
        nn.init.normal_(self.lm_head.weight, std=3.0 / spec.hidden_size ** 0.5, generator=generator)
        self.requires_grad_(False)

    def _greedy(self, hidden: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
        # Chunked over positions so (seq x vocab) logits never exist at once.
        return torch.cat([self.lm_head(self.norm(part)).argmax(-1) for part in hidden.split(chunk, dim=1)], dim=1)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor) -> TargetOutput:
        pos = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        rope = rope_cos_sin(pos, self.spec.head_dim, self.spec.rope_theta)
        x = self.embed(tokens)
        features = []
        for i, layer in enumerate(self.layers):
            x = layer(x, rope)
            if i in self.layer_ids:
                features.append(x)
        return TargetOutput(features=torch.cat(features, dim=-1), greedy=self._greedy(x))

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, total_len: int) -> torch.Tensor:
        """Greedy continuation of `prompt` (batch, p) to (batch, total_len), with a preallocated K/V cache."""
        spec, (batch, p) = self.spec, prompt.shape
        shape = (batch, spec.num_kv_heads, total_len, spec.head_dim)
        dtype = self.embed.weight.dtype
        caches = [(prompt.new_zeros(shape, dtype=dtype), prompt.new_zeros(shape, dtype=dtype)) for _ in self.layers]
        out = prompt.new_zeros((batch, total_len))
        out[:, :p] = prompt
        step_tokens, start = prompt, 0
        while start + step_tokens.shape[1] < total_len:
            n = step_tokens.shape[1]
            pos = torch.arange(start, start + n, device=prompt.device).expand(batch, -1)
            rope = rope_cos_sin(pos, spec.head_dim, spec.rope_theta)
            x = self.embed(step_tokens)
            for layer, cache in zip(self.layers, caches):
                x = layer(x, rope, cache=cache, start=start)
            nxt = self.lm_head(self.norm(x[:, -1:])).argmax(-1)
            start += n
            out[:, start] = nxt[:, 0]
            step_tokens = nxt
        return out


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

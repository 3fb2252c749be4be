"""The DFlash drafter: a few Qwen3-style layers that draft a block of B tokens in parallel from target features.

Target hidden states of several layers are concatenated, projected by `fc` and normalised into the context.
Every layer attends from the block tokens (queries) over cat(context, block) keys and values, with the mask of
`mask.py`. Embedding and LM head are the frozen target's, shared, not copied: they are not parameters of the
drafter, so they are neither trained, averaged nor saved with it.
"""
from __future__ import annotations

import torch
from torch import nn

from dflash_doctor.reference.config import ModelSpec
from dflash_doctor.reference.dense_compile import compiled
from dflash_doctor.reference.layers import QKV, RMSNorm, Rope, SwiGLU, init_weights, rope_cos_sin


class DrafterLayer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.input_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.attn = QKV(spec)
        self.post_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mlp = SwiGLU(spec.hidden_size, spec.intermediate_size)

    def project(self, x, context, block_rope: Rope, context_rope: Rope):
        """Everything before the attention: q of the block, k and v of cat(context, block)."""
        h = self.input_norm(x)
        q = self.attn.query(h, block_rope)
        k_ctx, v_ctx = self.attn.key_value(context, context_rope)  # context K/V injected into every layer
        k_blk, v_blk = self.attn.key_value(h, block_rope)
        return q, torch.cat([k_ctx, k_blk], dim=2), torch.cat([v_ctx, v_blk], dim=2)

    def finish(self, x, attn_out):
        """Everything after it: the output projection, the MLP and both residuals."""
        x = x + self.attn.output(attn_out)
        return x + self.mlp(self.post_norm(x))

    def forward(self, x, context, block_rope: Rope, context_rope: Rope, attend, compile_dense: bool = False):
        project, finish = DrafterLayer.project, DrafterLayer.finish
        if compile_dense:  # one compiled graph for each stretch, the attention between them its own call
            project, finish = compiled(project), compiled(finish)
        q, k, v = project(self, x, context, block_rope, context_rope)
        return finish(self, x, attend(q, k, v))


class Drafter(nn.Module):
    def __init__(self, spec: ModelSpec, num_layers: int, num_features: int, embed_weight: torch.Tensor,
                 lm_head_weight: torch.Tensor, seed: int = 0, compile_dense: bool = False):
        super().__init__()
        self.spec = spec
        self.compile_dense = compile_dense  # reference/dense_compile.py: the throughput presets' fused layers
        self.fc = nn.Linear(num_features * spec.hidden_size, spec.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(spec) for _ in range(num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        init_weights(self, seed)
        # Shared with the frozen target (plain tensors, deliberately not registered as parameters).
        self.shared = {"embed": embed_weight, "lm_head": lm_head_weight}

    def forward(self, features: torch.Tensor, block_ids: torch.Tensor, block_pos: torch.Tensor, attend):
        """features: (batch, ctx_len, F * hidden); block_ids, block_pos: (batch, blocks * B).

        Returns the final hidden states (batch, blocks * B, hidden), before the final norm (the loss applies it).
        Under autocast, `fc` reads the bf16 features as they come: an fp32 copy of them would only be cast back.
        """
        spec = self.spec
        context = self.hidden_norm(self.fc(features))
        ctx_pos = torch.arange(features.shape[1], device=features.device).expand(features.shape[0], -1)
        # RoPE tables in the dtype q and k will have: bf16 under autocast (the projections' output), else fp32.
        dtype = torch.get_autocast_dtype(features.device.type) if torch.is_autocast_enabled(
            features.device.type) else self.fc.weight.dtype
        context_rope = rope_cos_sin(ctx_pos, spec.head_dim, spec.rope_theta, dtype)
        block_rope = rope_cos_sin(block_pos, spec.head_dim, spec.rope_theta, dtype)
        x = nn.functional.embedding(block_ids, self.shared["embed"]).to(self.fc.weight.dtype)
        for layer in self.layers:
            x = layer(x, context, block_rope, context_rope, attend, self.compile_dense)
        return x

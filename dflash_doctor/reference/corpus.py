"""The training data: random prompts continued greedily by the target, written once in set-up and shared by every
target worker (the drafter learns the target's greedy tokens, so the text must be the target's own greedy text).

Greedy decoding is sequential: one forward per token. Measured on the H200 (torch 2.11) with the earlier loop, in
which every target worker wrote a corpus of its own, one eager decode step cost about 48 ms of kernel launches
(86 s for the small preset's 1,792 tokens; the seeds preset's five workers did it five times over and never
reached a drafter step in 125 s). Here the corpus is one batch, written once, and every decode step has static
shapes: a K/V cache of the final length, attention masked to the positions written so far, the position a device
tensor. So on a GPU the step is captured once as a CUDA graph and replayed, one launch per token; on a CPU (or
if capture fails) the same step runs eagerly.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

from dflash_doctor.reference.facts import WrittenCorpusFacts
from dflash_doctor.reference.graphs import CapturedCall, try_capture
from dflash_doctor.reference.layers import derive_seed


@dataclass(frozen=True)
class CorpusFacts:
    sequences: int
    prompt_len: int
    seq_len: int
    seconds: float
    decode: str  # cuda-graph | eager
    eager_reason: Optional[str] = None  # why the decode step was not replayed from a CUDA graph

    def to_dict(self) -> WrittenCorpusFacts:
        return {"sequences": self.sequences, "prompt_len": self.prompt_len, "seq_len": self.seq_len,
                "seconds": round(self.seconds, 3), "decode": self.decode, "eager_reason": self.eager_reason}


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Attention of q (batch, heads, n, d) over k, v (batch, kv_heads, T, d) where `visible` (T,) allows, with
    query head h reading kv head h // (heads / kv_heads), like SDPA's enable_gqa, without repeating K and V."""
    b, heads, n, d = q.shape
    kv_heads = k.shape[1]
    grouped = q.reshape(b, kv_heads, (heads // kv_heads) * n, d)
    scores = torch.matmul(grouped, k.transpose(-1, -2)).float() * d ** -0.5
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1).to(v.dtype)
    return torch.matmul(probs, v).reshape(b, heads, n, d)


class GreedyDecoder:
    """Greedy continuation of a batch of prompts to `total_len` tokens with a preallocated K/V cache.

    `step()` reads only fixed-shape tensors (the cache, `tokens`, the position `pos` as a device tensor) and
    writes them in place, so it is the same computation whether it runs eagerly or replays from a CUDA graph.
    """

    def __init__(self, target, prompts: torch.Tensor, total_len: int) -> None:
        spec = target.spec
        batch, prompt_len = prompts.shape
        if not 0 < prompt_len < total_len:
            raise ValueError(f"prompt length {prompt_len} must be in 1..{total_len - 1}")
        self.target, self.total_len, self.prompt_len = target, total_len, prompt_len
        device, dtype = prompts.device, target.embed.weight.dtype
        shape = (batch, spec.num_kv_heads, total_len, spec.head_dim)
        self.caches: List[Tuple[torch.Tensor, torch.Tensor]] = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in target.layers]
        self.tokens = torch.zeros((batch, total_len), dtype=torch.long, device=device)
        self.key_positions = torch.arange(total_len, device=device)
        self.pos = torch.full((1,), prompt_len, dtype=torch.long, device=device)
        self._prefill(prompts)

    @property
    def steps_left(self) -> int:
        """Decode steps after the prefill (which writes position prompt_len; each step writes one more)."""
        return self.total_len - 1 - self.prompt_len

    @torch.no_grad()
    def _prefill(self, prompts: torch.Tensor) -> None:
        target, p = self.target, prompts.shape[1]
        rope = target.rope(torch.arange(p, device=prompts.device).expand(prompts.shape[0], -1))
        x = target.embed(prompts)
        for layer, (k_cache, v_cache) in zip(target.layers, self.caches):
            h = layer.input_norm(x)
            k, v = layer.attn.key_value(h, rope)
            k_cache[:, :, :p] = k
            v_cache[:, :, :p] = v
            out = F.scaled_dot_product_attention(layer.attn.query(h, rope), k, v, is_causal=True, enable_gqa=True)
            x = layer.residual_mlp(x, out)
        self.tokens[:, :p] = prompts
        self.tokens[:, p] = target.lm_head(target.norm(x[:, -1])).argmax(-1)

    @torch.no_grad()
    def step(self) -> None:
        """Feed the token at `pos`, write the greedy token at `pos + 1`, advance `pos`."""
        target = self.target
        batch = self.tokens.shape[0]
        rope = target.rope(self.pos.expand(batch, 1))
        visible = self.key_positions <= self.pos
        x = target.embed(self.tokens.index_select(1, self.pos))
        for layer, (k_cache, v_cache) in zip(target.layers, self.caches):
            h = layer.input_norm(x)
            k, v = layer.attn.key_value(h, rope)
            k_cache.index_copy_(2, self.pos, k)
            v_cache.index_copy_(2, self.pos, v)
            x = layer.residual_mlp(x, grouped_attention(layer.attn.query(h, rope), k_cache, v_cache, visible))
        self.tokens.index_copy_(1, self.pos + 1, target.lm_head(target.norm(x)).argmax(-1))
        self.pos.add_(1)

    def run(self, use_graph: bool = True) -> Tuple[torch.Tensor, Optional[str]]:
        """Decode to the end; (tokens, why the steps ran eagerly or None)."""
        replay: Optional[CapturedCall] = None
        reason: Optional[str] = "CUDA graphs not wanted"
        if use_graph and self.steps_left > 3:
            replay, reason = try_capture(self.step, self.tokens.device)
        # Capture's warm-up calls were real steps (and a failed capture may have run some): ask where we are.
        left = self.total_len - 1 - int(self.pos.item())
        for _ in range(left):
            (replay or self.step)()
        return self.tokens, reason


def random_prompts(vocab_size: int, sequences: int, prompt_len: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(derive_seed(seed, "corpus-prompts"))
    return torch.randint(1, vocab_size - 1, (sequences, prompt_len), generator=generator)


def write_corpus(target, sequences: int, prompt_len: int, seq_len: int, seed: int, device: torch.device,
                 clock: Callable[[], float] = time.perf_counter) -> Tuple[torch.Tensor, CorpusFacts]:
    """The shared corpus (on the CPU: a few hundred KB every worker samples from) and how it was written."""
    began = clock()
    prompts = random_prompts(target.spec.vocab_size, sequences, prompt_len, seed).to(device)
    reason: Optional[str]
    if hasattr(target, "generate"):  # a Hugging Face target decodes with its own generate()
        tokens, reason = target.generate(prompts, seq_len), "a Hugging Face target decodes with generate()"
    else:
        tokens, reason = GreedyDecoder(target, prompts, seq_len).run()
    corpus = tokens.cpu()
    facts = CorpusFacts(sequences, prompt_len, seq_len, clock() - began, "eager" if reason else "cuda-graph", reason)
    return corpus, facts

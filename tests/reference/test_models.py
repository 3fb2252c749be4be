"""The target's building blocks and the corpus writer against plain reference computations (real torch, CPU)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from dflash_doctor.reference.config import TINY  # noqa: E402
from dflash_doctor.reference.corpus import GreedyDecoder, grouped_attention, write_corpus  # noqa: E402
from dflash_doctor.reference.layers import derive_seed, rms_norm  # noqa: E402
from dflash_doctor.reference.target import build_target, build_target_heads  # noqa: E402

CPU = torch.device("cpu")


def test_rms_norm_is_the_fp32_formula_in_the_inputs_dtype():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 64, generator=gen)
    w = torch.rand(64, generator=gen)
    plain = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(rms_norm(x, w, 1e-6), plain, atol=1e-6)
    low = rms_norm(x.bfloat16(), w, 1e-6)
    assert low.dtype == torch.bfloat16 and torch.allclose(low.float(), plain, atol=3e-2)


def test_derived_seeds_are_stable_and_independent_per_stream():
    assert derive_seed(0, "target", "embed") == derive_seed(0, "target", "embed")
    seeds = {derive_seed(s, label) for s in (0, 1, 2 ** 63 - 1) for label in ("embed", "lm_head", "anchors")}
    assert len(seeds) == 9 and all(0 <= s < 2 ** 63 for s in seeds)


def test_a_drafters_heads_equal_the_whole_targets_without_building_its_layers():
    target = build_target(TINY.target, TINY.target_layer_ids, seed=7, device=CPU, dtype=torch.float32)
    heads = build_target_heads(TINY.target, seed=7, device=CPU, dtype=torch.float32)
    assert torch.equal(heads.embed.weight, target.embed.weight)
    assert torch.equal(heads.lm_head.weight, target.lm_head.weight)
    other = build_target(TINY.target, TINY.target_layer_ids, seed=8, device=CPU, dtype=torch.float32)
    assert not torch.equal(other.embed.weight, target.embed.weight)
    assert all(not p.requires_grad for p in target.parameters())


def test_grouped_attention_equals_sdpa_with_gqa_and_the_same_mask():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 1, 16, generator=gen)
    k = torch.randn(2, 2, 12, 16, generator=gen)
    v = torch.randn(2, 2, 12, 16, generator=gen)
    visible = torch.arange(12) <= 6
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[None, :], enable_gqa=True)
    assert torch.allclose(grouped_attention(q, k, v, visible), expected, atol=1e-5)


def _greedy_by_full_forwards(target, prompt, total_len):
    """The definition: append the argmax of the last position, one full forward per token."""
    tokens = prompt
    while tokens.shape[1] < total_len:
        nxt = target(tokens).greedy[:, -1:]
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens


@pytest.mark.slow  # end to end: `pytest -m slow` (README, .ci/run)
def test_static_shape_decoder_writes_exactly_the_greedy_continuation():
    target = build_target(TINY.target, TINY.target_layer_ids, seed=3, device=CPU, dtype=torch.float32)
    prompt = torch.randint(1, TINY.target.vocab_size - 1, (3, 5), generator=torch.Generator().manual_seed(2))
    tokens, reason = GreedyDecoder(target, prompt, 24).run()
    assert reason == "not a CUDA device"
    assert torch.equal(tokens, _greedy_by_full_forwards(target, prompt, 24))


def test_the_corpus_is_written_once_on_the_host_with_its_facts():
    target = build_target(TINY.target, TINY.target_layer_ids, seed=0, device=CPU, dtype=torch.float32)
    corpus, facts = write_corpus(target, sequences=4, prompt_len=8, seq_len=20, seed=0, device=CPU)
    assert corpus.shape == (4, 20) and corpus.device.type == "cpu"
    assert (facts.sequences, facts.prompt_len, facts.seq_len, facts.decode) == (4, 8, 20, "eager")
    again, _ = write_corpus(target, sequences=4, prompt_len=8, seq_len=20, seed=0, device=CPU)
    assert torch.equal(corpus, again)  # same seed, same corpus: every process can rely on it


def test_decoder_refuses_a_prompt_as_long_as_the_sequence():
    target = build_target(TINY.target, TINY.target_layer_ids, seed=0, device=CPU, dtype=torch.float32)
    with pytest.raises(ValueError, match="prompt length 8 must be in 1..7"):
        GreedyDecoder(target, torch.ones(1, 8, dtype=torch.long), 8)

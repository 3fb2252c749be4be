"""Loss weights (values, decay, zeros) and the chunked, checkpointed loss against a plain reference."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from dflash_doctor.reference.layers import RMSNorm  # noqa: E402
from dflash_doctor.reference.loss import (  # noqa: E402
    block_labels, chunked_loss, loss_weights, position_weights,
)


def test_position_weights_zero_for_the_anchor_then_decay_from_one():
    w = position_weights(5, decay=2.0)
    expected = [0.0, 1.0, math.exp(-0.5), math.exp(-1.0), math.exp(-1.5)]
    assert w.tolist() == pytest.approx(expected)
    assert all(a > b for a, b in zip(w[1:].tolist(), w[2:].tolist()))  # strictly decaying after the anchor


def test_loss_weights_zero_on_padded_blocks_and_past_the_sequence_end():
    anchors = torch.tensor([[2, 6], [5, -1]])
    lengths = torch.tensor([8, 7])
    w = loss_weights(anchors, lengths, block_size=3, decay=1.0).view(2, 2, 3)
    one, e1 = 1.0, math.exp(-1.0)
    assert w[0, 0].tolist() == pytest.approx([0, one, e1])  # labels at 3, 4 < 8
    assert w[0, 1].tolist() == pytest.approx([0, one, 0])  # label position 8 is past length 8
    assert w[1, 0].tolist() == pytest.approx([0, one, 0])  # label position 7 is past length 7
    assert w[1, 1].tolist() == [0, 0, 0]  # padded block


def test_block_labels_are_the_targets_greedy_tokens_made_one_position_earlier():
    greedy = torch.arange(50, 66).view(1, 16)  # greedy[t] is the target's choice for position t + 1
    labels = block_labels(greedy, torch.tensor([[4, 10]]), block_size=3)
    assert labels.tolist() == [[53, 54, 55, 59, 60, 61]]  # block position k: greedy[anchor + k - 1]


def _plain_loss(hidden, norm, head, labels, weights):
    logits = torch.nn.functional.linear(norm(hidden.reshape(-1, hidden.shape[-1])), head)
    ce = torch.nn.functional.cross_entropy(logits, labels.reshape(-1), reduction="none")
    return (ce * weights.reshape(-1)).sum() / weights.sum()


@pytest.mark.parametrize("checkpoint", ["none", "reentrant", "non-reentrant"])
def test_chunked_loss_and_gradients_equal_the_plain_loss(checkpoint):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 12, 8, generator=gen, requires_grad=True)
    head = torch.randn(20, 8, generator=gen)
    labels = torch.randint(0, 20, (2, 12), generator=gen)
    weights = loss_weights(torch.tensor([[3, 9, 15], [2, -1, -1]]), torch.tensor([30, 30]), 4, 2.0)
    norm = RMSNorm(8)
    expected = _plain_loss(hidden, norm, head, labels, weights)
    (grad_h, grad_n) = torch.autograd.grad(expected, (hidden, norm.weight))
    got = chunked_loss(hidden, norm, head, labels, weights, chunk=5, checkpoint=checkpoint)
    got.backward()
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.allclose(hidden.grad, grad_h, atol=1e-6)
    assert torch.allclose(norm.weight.grad, grad_n, atol=1e-6)


def test_chunked_loss_rejects_an_unknown_checkpoint_mode():
    with pytest.raises(ValueError, match="checkpoint must be one of"):
        chunked_loss(torch.zeros(1, 1, 2), RMSNorm(2), torch.zeros(3, 2), torch.zeros(1, 1, dtype=torch.long),
                     torch.ones(1, 1), 4, "sometimes")

"""The DFlash training mask against a brute-force reading of its definition, and anchor sampling."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dflash_doctor.reference import mask as masks  # noqa: E402


def brute_force(anchors, ctx_len, block_size):
    """The definition, one element at a time: context strictly before the anchor, own block both ways."""
    batch, blocks = anchors.shape
    queries = blocks * block_size
    out = torch.zeros(batch, 1, queries, ctx_len + queries, dtype=torch.bool)
    for b in range(batch):
        for q in range(queries):
            anchor = int(anchors[b, q // block_size])
            if anchor < 0:
                continue  # a padded block sees nothing
            for kv in range(ctx_len + queries):
                if kv < ctx_len:
                    out[b, 0, q, kv] = kv < anchor
                else:
                    out[b, 0, q, kv] = (kv - ctx_len) // block_size == q // block_size
    return out


CASES = [
    # (anchors, ctx_len, block_size): padding blocks, anchor 1 (one context position), adjacent anchors
    ([[1, 5, 9, -1], [3, 4, -1, -1]], 16, 2),
    ([[2, 7, 11]], 16, 4),
    ([[8, 20], [-1, -1], [30, 31]], 40, 3),
    ([[5, 10, 15, 25, 40, 60, 70, 100]], 128, 16),
]


@pytest.mark.parametrize("anchors, ctx_len, block_size", CASES)
def test_dense_mask_matches_brute_force(anchors, ctx_len, block_size):
    anchors = torch.tensor(anchors)
    assert torch.equal(masks.dense_mask_for(anchors, ctx_len, block_size), brute_force(anchors, ctx_len, block_size))


@pytest.mark.parametrize("anchors, ctx_len, block_size", CASES)
def test_mask_mod_through_flex_create_mask_matches_brute_force(anchors, ctx_len, block_size):
    from torch.nn.attention.flex_attention import create_mask

    anchors = torch.tensor(anchors)
    batch, blocks = anchors.shape
    queries = blocks * block_size
    made = create_mask(masks.dflash_mask_mod(anchors, ctx_len, block_size), batch, None, queries, ctx_len + queries,
                       device="cpu")
    assert torch.equal(made, brute_force(anchors, ctx_len, block_size))


@pytest.mark.parametrize("anchors, ctx_len, block_size", CASES)
def test_block_mask_covers_every_visible_element_and_skips_empty_tiles(anchors, ctx_len, block_size):
    anchors = torch.tensor(anchors)
    dense = brute_force(anchors, ctx_len, block_size)
    bm = masks.block_mask_for(anchors, ctx_len, block_size, "cpu")
    tile_q, tile_kv = bm.BLOCK_SIZE
    tiles = bm.to_dense().bool()  # (batch, 1, q tiles, kv tiles): tiles flex will visit
    batch, _, queries, keys = dense.shape
    for b in range(batch):
        for qt in range(tiles.shape[2]):
            for kt in range(tiles.shape[3]):
                visible = dense[b, 0, qt * tile_q:(qt + 1) * tile_q, kt * tile_kv:(kt + 1) * tile_kv].any()
                assert bool(tiles[b, 0, qt, kt]) == bool(visible), (b, qt, kt)


def test_sample_anchors_sorted_distinct_in_the_response_and_padded_when_short():
    gen = torch.Generator().manual_seed(3)
    lengths = torch.tensor([64, 20, 12, 9])
    anchors = masks.sample_anchors(lengths, prompt_len=8, block_size=4, blocks=6, generator=gen)
    assert anchors.shape == (4, 6)
    for row, length in zip(anchors.tolist(), lengths.tolist()):
        real = [a for a in row if a != masks.PAD_ANCHOR]
        assert real == sorted(set(real))
        assert all(8 <= a <= length - 4 for a in real)
        assert row[len(real):] == [masks.PAD_ANCHOR] * (6 - len(real))  # padding only at the end
    assert anchors[0].ge(0).sum() == 6 and anchors[1].ge(0).sum() == 6  # 53 and 9 candidates: 6 picked
    assert anchors[2].ge(0).sum() == 1  # only anchor 8 fits (8 + 4 <= 12)
    assert anchors[3].ge(0).sum() == 0  # too short for any block


def test_block_inputs_and_positions():
    tokens = torch.arange(100, 132).view(2, 16)
    anchors = torch.tensor([[2, 9], [5, -1]])
    ids = masks.block_inputs(tokens, anchors, block_size=3, mask_token_id=7)
    assert ids.tolist() == [[102, 7, 7, 109, 7, 7], [121, 7, 7, 116, 7, 7]]
    assert masks.block_positions(anchors, 3).tolist() == [[2, 3, 4, 9, 10, 11], [5, 6, 7, 0, 1, 2]]

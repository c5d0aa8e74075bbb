import numpy as np
import pytest

from longca.cp import sharding as sh
from longca.cp.submask import coalesce, layouts_of_groups, sub_mask
from longca.masks import slices as sl
from longca.masks.registry import PATTERNS, build_mask

STATIC = sorted(n for n, p in PATTERNS.items() if p.family != "dynamic")
PARAMS = {
    "sliding_window": {"window": 3},
    "causal_sliding_window": {"window": 3},
    "global_sliding_window": {"global_tokens": 2, "window": 3},
    "block_causal_document": {"block": 4},
}


@pytest.mark.parametrize("name", STATIC)
@pytest.mark.parametrize("balance", sh.BALANCES)
def test_sub_masks_are_the_permuted_global_mask(name, balance):
    """Every (rank, rank) sub-mask equals the block of the permuted dense mask; areas add up."""
    s, w = 32, 4
    mask = build_mask(name, s, PARAMS.get(name), seed=1)
    shard = sh.make_sharding(balance, s, w, mask.slices)
    perm = shard.permutation()
    dense = mask.dense()[np.ix_(perm, perm)]
    n = s // w
    total = 0
    for i in range(w):
        for j in range(w):
            sub = sub_mask(mask.slices, shard.intervals[i], shard.intervals[j])
            assert (sl.to_dense(sub, n, n) == dense[i * n : (i + 1) * n, j * n : (j + 1) * n]).all()
            total += sl.area(sub)
    assert total == mask.area


def test_group_layout_concatenates_members_in_order():
    shard = sh.zigzag(16, 4)
    layouts = layouts_of_groups(shard.intervals, [[0, 1], [2, 3]])
    assert layouts[0] == ((0, 2), (14, 16), (2, 4), (12, 14))


def test_coalesce_merges_touching_full_rectangles_only():
    s = sl.make_slices(
        [
            (0, 4, 0, 4, sl.Kind.FULL),
            (0, 4, 4, 8, sl.Kind.FULL),
            (4, 8, 0, 8, sl.Kind.FULL),
            (8, 12, 8, 12, sl.Kind.CAUSAL),
        ]
    )
    out = coalesce(s)
    assert sorted(map(tuple, out.tolist())) == [(0, 8, 0, 8, 0), (8, 12, 8, 12, 1)]
    assert sl.area(out) == sl.area(s)


def test_zigzag_causal_steps_are_few_rectangles():
    """Off-diagonal steps of causal zigzag are one FULL rectangle: one kernel call per step."""
    mask = build_mask("causal", 64)
    shard = sh.zigzag(64, 2)
    sub = sub_mask(mask.slices, shard.intervals[0], shard.intervals[1])
    assert sub.tolist() == [[16, 32, 0, 32, int(sl.Kind.FULL)]]


def test_zigzag_causal_own_step_is_one_causal_square():
    """The own-KV step of causal zigzag (head chunk, tail chunk): two causal squares and the full
    block between them are one causal square over the local sequence: one kernel call, not three."""
    mask = build_mask("causal", 64)
    shard = sh.zigzag(64, 2)
    for r in range(2):
        sub = sub_mask(mask.slices, shard.intervals[r], shard.intervals[r])
        assert sub.tolist() == [[0, 32, 0, 32, int(sl.Kind.CAUSAL)]]


def test_causal_squares_merge_only_with_the_full_block_between_them():
    a, c = (0, 4, 0, 4, sl.Kind.CAUSAL), (4, 8, 4, 8, sl.Kind.CAUSAL)
    without = sl.make_slices([a, c])  # block-diagonal (documents): stays two squares
    assert sorted(map(tuple, coalesce(without).tolist())) == [(0, 4, 0, 4, 1), (4, 8, 4, 8, 1)]
    chain = sl.make_slices(
        [a, c, (4, 8, 0, 4, sl.Kind.FULL), (8, 10, 8, 10, sl.Kind.CAUSAL), (8, 10, 0, 8, sl.Kind.FULL)]
    )
    out = coalesce(chain)  # merges twice: [0, 8) then [0, 10)
    assert out.tolist() == [[0, 10, 0, 10, int(sl.Kind.CAUSAL)]]
    assert (sl.to_dense(out, 10, 10) == sl.to_dense(chain, 10, 10)).all()

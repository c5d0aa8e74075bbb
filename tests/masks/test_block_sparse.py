"""Block-sparse masks: top-k per query block and KV head, exact areas, importance scores."""

import numpy as np
import pytest
import torch

from longca.masks import block_sparse as bs
from longca.masks.blocks import BlockLayout
from longca.masks.registry import build_mask


def test_keeps_density_share_of_key_blocks_per_row_and_head():
    m = build_mask("block_sparse", 1000, {"block": 64, "density": 0.25}, heads_kv=3)
    kept = m.blocks.kept
    assert kept.shape == (3, 16, 16)
    assert (kept.sum(axis=-1) == 4).all()  # 0.25 * 16
    assert m.params["kept_per_query_block"] == 4
    assert not np.array_equal(kept[0], kept[1])  # heads differ (random scores per head)
    # area = kept blocks x block areas, the ragged last block (1000 = 15 * 64 + 40) included
    sizes = np.diff(m.blocks.q_bounds)
    assert sizes[-1] == 40
    want = sum(int(sizes[i]) * int(sizes[j]) for h, i, j in zip(*np.nonzero(kept)))
    assert m.area == want == m.dense().sum()


def test_keep_count_rounds_half_up_and_keeps_at_least_one():
    assert [bs.keep_count(d, 10) for d in (0.01, 0.15, 0.25, 0.5, 1.0)] == [1, 2, 3, 5, 10]
    with pytest.raises(ValueError, match="outside"):
        bs.keep_count(0.0, 10)


def test_variable_blocks_respect_min_and_cover_the_sequence():
    m = build_mask("variable_block_sparse", 5000, {"min_block": 128, "mean_block": 400}, seed=3)
    for bounds in (m.blocks.q_bounds, m.blocks.k_bounds):
        sizes = np.diff(bounds)
        assert bounds[0] == 0 and bounds[-1] == 5000
        assert (sizes[:-1] >= 128).all() and sizes[-1] >= 1
    assert m.blocks.uniform_block is None
    assert m.area == m.dense().sum()


def test_importance_keeps_the_blocks_with_the_largest_pooled_scores():
    S, D, block = 256, 8, 64
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, S, 4, D, generator=g) * 0.01
    k = torch.randn(1, S, 2, D, generator=g) * 0.01
    # KV head 0: every query aligns with key block 2; KV head 1: with key block 1.
    q[:, :, 0:2, 0] += 1.0
    k[:, 128:192, 0, 0] += 5.0
    q[:, :, 2:4, 1] += 1.0
    k[:, 64:128, 1, 1] += 5.0
    m = build_mask("block_sparse", S, {"block": block, "density": 0.25, "score": "importance"}, inputs=(q, k))
    assert m.params["heads_kv"] == 2
    assert (np.nonzero(m.blocks.kept[0])[1] == 2).all()
    assert (np.nonzero(m.blocks.kept[1])[1] == 1).all()
    # scores are exactly mean-pooled q . k (pooled over batch, the query heads of a group, tokens)
    sc = bs.importance_scores(q, k, m.blocks.q_bounds, m.blocks.k_bounds, 2)
    qp = q[0, 64:128, 2:4].mean(dim=(0, 1))
    kp = k[0, 192:256, 1].mean(dim=0)
    assert sc[1, 1, 3] == pytest.approx(float(qp @ kp), rel=1e-5)


def test_importance_needs_inputs_of_the_right_shape():
    with pytest.raises(ValueError, match="needs the cell's inputs"):
        build_mask("block_sparse", 128, {"score": "importance"})
    q = torch.zeros(1, 100, 2, 4)
    with pytest.raises(ValueError, match="do not match the mask"):
        build_mask("block_sparse", 128, {"score": "importance"}, inputs=(q, q))


def _stable_argsort_top_k(scores: np.ndarray, keep: int) -> np.ndarray:
    """The definition: a stable descending sort's first `keep` columns (ties to the lower index)."""
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :keep]
    kept = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(kept, order, True, axis=-1)
    return kept


@pytest.mark.parametrize("scores_kind", ["random", "few_values", "constant"])
def test_linear_time_top_k_keeps_the_same_blocks_as_a_stable_sort(scores_kind):
    rng = np.random.default_rng(7)
    for _ in range(200):
        shape = (int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 40)))
        if scores_kind == "random":
            scores = rng.random(shape)
        elif scores_kind == "few_values":  # many ties at the threshold
            scores = rng.integers(0, 3, shape).astype(np.float64)
        else:
            scores = np.ones(shape)
        keep = int(rng.integers(1, shape[-1] + 1))
        np.testing.assert_array_equal(bs.top_k_kept(scores, keep), _stable_argsort_top_k(scores, keep))


def test_area_per_head_matches_the_exact_integer_sum_on_ragged_blocks():
    rng = np.random.default_rng(3)
    for _ in range(30):
        qb = bs.variable_bounds(int(rng.integers(50, 3000)), 16, 64, rng)
        kb = bs.variable_bounds(int(rng.integers(50, 3000)), 16, 48, rng)
        kept = rng.random((3, len(qb) - 1, len(kb) - 1)) < rng.random()
        layout = BlockLayout(qb, kb, kept, None)
        exact = np.einsum("hij,i,j->h", kept.astype(np.int64), np.diff(qb), np.diff(kb))
        area = layout.area_per_head()
        assert area.dtype == np.int64
        np.testing.assert_array_equal(area, exact)

"""FlexAttention BlockMask from slices: exact block states, mask_mod, torch-compatible indices."""

import numpy as np
import pytest
import torch

from longca.masks import flex
from longca.masks.registry import PATTERNS, build_mask

SMALL = {
    "sliding_window": {"window": 9},
    "causal_sliding_window": {"window": 9},
    "block_causal_document": {"block": 13, "max_blocks": 3},
    "block_sparse": {"block": 24},
    "variable_block_sparse": {"min_block": 10, "mean_block": 30},
    "full_document": {"distribution": "file:"},
    "causal_document": {"distribution": "file:"},
}


def small_mask(name, S, seed=1, tmp=None):
    params = dict(SMALL.get(name, {}))
    if params.get("distribution") == "file:":
        params["distribution"] = f"file:{tmp}"
    dyn = PATTERNS[name].family == "dynamic"
    return build_mask(name, S, params, seed=seed, heads_kv=2 if dyn else None)


@pytest.fixture(scope="module")
def doc_hist(tmp_path_factory):
    f = tmp_path_factory.mktemp("h") / "short.csv"
    f.write_text("low,high,weight\n1,40,1\n")  # many short documents at small S
    return f


def expected_states(dense, bq, bk):
    h, S, T = dense.shape
    nq, nk = -(-S // bq), -(-T // bk)
    pad = np.zeros((h, nq * bq, nk * bk), bool)
    pad[:, :S, :T] = dense
    count = pad.reshape(h, nq, bq, nk, bk).sum(axis=(2, 4))
    inside = np.zeros((nq * bq, nk * bk), bool)
    inside[:S, :T] = True
    area = inside.reshape(nq, bq, nk, bk).sum(axis=(1, 3))
    return np.where(count == area, flex.FULL, np.where(count > 0, flex.PARTIAL, flex.EMPTY))


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("S,block", [(37, 8), (130, 16), (257, (32, 16)), (300, 64)])
def test_blockmask_matches_dense_pair_by_pair(name, S, block, doc_hist):
    m = small_mask(name, S, tmp=doc_hist)
    dense = m.dense()
    dense = dense if dense.ndim == 3 else dense[None]
    bq, bk = (block, block) if isinstance(block, int) else block
    assert (flex.mask_states(m, block) == expected_states(dense, bq, bk)).all()
    bm = flex.to_block_mask(m, block)
    assert bm.BLOCK_SIZE == (bq, bk) and bm.seq_lengths == (S, S)
    assert (flex.block_mask_dense(bm, S, S, heads=dense.shape[0]) == dense).all()


def test_q_direction_tensors_equal_torchs_transpose():
    from torch.nn.attention.flex_attention import _transpose_ordered

    for name in ("share_question", "global_sliding_window", "block_sparse"):
        bm = flex.to_block_mask(small_mask(name, 300), 16)
        for kv_num, kv_idx, q_num, q_idx in (
            (bm.kv_num_blocks, bm.kv_indices, bm.q_num_blocks, bm.q_indices),
            (bm.full_kv_num_blocks, bm.full_kv_indices, bm.full_q_num_blocks, bm.full_q_indices),
        ):
            want_num, want_idx = _transpose_ordered(kv_num, kv_idx)
            assert torch.equal(q_num, want_num)
            for r in range(q_num.shape[-1]):
                n = int(q_num[0, 0, r])
                assert torch.equal(q_idx[0, 0, r, :n], want_idx[0, 0, r, :n])


def test_a_forward_only_blockmask_has_no_q_direction_tensors_and_the_same_kv_ones():
    m = build_mask("block_sparse", 300, {"block": 32}, heads_kv=2, seed=4)
    both, fwd = flex.to_block_mask(m, 32, heads_q=4), flex.to_block_mask(m, 32, heads_q=4, backward=False)
    assert both.q_indices is not None and both.full_q_indices is not None
    assert (fwd.q_num_blocks, fwd.q_indices, fwd.full_q_num_blocks, fwd.full_q_indices) == (None,) * 4
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(fwd, name), getattr(both, name)), name


def test_gqa_broadcast_maps_query_heads_to_kv_heads():
    m = build_mask("block_sparse", 200, {"block": 32}, heads_kv=2, seed=4)
    bm = flex.to_block_mask(m, 32, heads_q=6)
    assert bm.kv_num_blocks.shape[:2] == (1, 6)
    assert (flex.block_mask_dense(bm, 200, 200, heads=6) == np.repeat(m.dense(), 3, axis=0)).all()
    with pytest.raises(ValueError, match="not a multiple"):
        flex.to_block_mask(m, 32, heads_q=5)


def test_mask_mod_layers_are_the_most_slices_sharing_a_row():
    assert flex.mask_mod_from_slices(build_mask("full", 64).slices, 64, 64).layers == 1
    gsw = build_mask("global_sliding_window", 64, {"global_tokens": 4, "window": 3})
    assert flex.mask_mod_from_slices(gsw.slices, 64, 64).layers == 2


def test_row_intervals_stay_linear_in_s():
    # 512K: K x S int32 per bound, never S x S
    m = build_mask("share_question", 1 << 19, seed=0)
    lo, hi = flex.row_intervals(m.slices, m.seqlen_q, 128)
    assert lo.shape == (2, 1 << 19) and lo.dtype == np.int32


def test_compiled_flex_attention_with_the_blockmask_matches_the_dense_reference(tmp_path):
    from torch.nn.attention.flex_attention import flex_attention

    hist = tmp_path / "docs.csv"
    hist.write_text("30,120,1\n")
    S = 300  # not a multiple of the block: ragged last blocks
    m = build_mask("prefix_lm_document", S, {"distribution": f"file:{hist}", "prefix": 40}, seed=2)
    assert m.num_documents >= 2
    bm = flex.to_block_mask(m, 32)
    assert int(bm.kv_num_blocks.sum()) > 0 and int(bm.full_kv_num_blocks.sum()) > 0
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, S, 16, generator=g) for _ in range(3))
    out = torch.compile(flex_attention)(q, k, v, block_mask=bm)
    scores = (q @ k.transpose(-1, -2)) / 4.0
    scores = scores.masked_fill(~torch.as_tensor(m.dense()), float("-inf"))
    ref = torch.softmax(scores.double(), dim=-1).float() @ v
    assert (out - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_block_counts_are_exact(name, doc_hist):
    m = small_mask(name, 301, tmp=doc_hist)
    dense = m.dense()
    dense = dense if dense.ndim == 3 else dense[None]
    pad = np.zeros((dense.shape[0], 320, 304), bool)  # 10 blocks of 32 x 19 blocks of 16
    pad[:, :301, :301] = dense
    want = pad.reshape(dense.shape[0], 10, 32, 19, 16).sum(axis=(2, 4))
    assert (flex.mask_block_counts(m, 32, 16) == want).all()


def test_ordered_indices_list_true_columns_first_for_any_grid():
    rng = np.random.default_rng(0)
    for _ in range(200):
        grid = rng.random((2, int(rng.integers(1, 9)), int(rng.integers(1, 12)))) < rng.random()
        num, idx = flex._ordered(grid)
        assert (num == grid.sum(-1)).all()
        assert idx.min() >= 0 and idx.max() < grid.shape[-1]  # padding entries are valid indices
        for h, r in np.ndindex(grid.shape[:2]):
            assert (idx[h, r, : num[h, r]] == np.nonzero(grid[h, r])[0]).all()


@pytest.mark.parametrize("sort", [False, True])
def test_index_tensors_repeat_kv_heads_per_query_head_in_either_ordering(sort):
    # sort=True is the GPU's path (a stable sort per head), sort=False the CPU's _ordered: both list
    # a row's True columns first, ascending, and repeat KV head h as query heads h*g .. h*g+g-1.
    rng = np.random.default_rng(1)
    grid = rng.random((3, 7, 11)) < 0.4
    num, idx = flex._index_tensors(grid, 2, "cpu", sort=sort)
    assert num.shape == (1, 6, 7) and idx.shape == (1, 6, 7, 11)
    assert num.dtype == idx.dtype == torch.int32
    for hq, r in np.ndindex(6, 7):
        want = np.nonzero(grid[hq // 2, r])[0]
        assert num[0, hq, r] == len(want)
        assert (idx[0, hq, r, : len(want)].numpy() == want).all()


def test_a_layout_on_its_own_grid_is_full_where_kept_as_the_counting_path_says(monkeypatch):
    m = build_mask("block_sparse", 300, {"block": 32, "density": 0.5}, seed=2, heads_kv=2)  # ragged last block
    counts = flex.layout_block_counts(m.blocks, 32, 32)
    with monkeypatch.context() as patch:  # the own grid takes the shortcut, without counting
        patch.setattr(flex, "layout_block_counts", None)
        fast = flex.layout_block_states(m.blocks, 32, 32)
    assert (fast == np.where(counts > 0, flex.FULL, flex.EMPTY)).all()
    assert set(np.unique(flex.layout_block_states(m.blocks, 64, 64))) >= {flex.PARTIAL}  # another grid counts


def test_rectangular_sub_masks_as_context_parallelism_uses_them():
    from longca.masks import slices as sl
    from longca.masks.mask import Mask

    full = build_mask("share_question", 400, {"distribution": "pile"}, seed=3)
    # the (rank 1 queries, rank 0 keys) block of a 2-way split, shifted to local coordinates
    part = sl.shift_slices(sl.clip_slices(full.slices, 200, 400, 0, 150), dq=-200)
    m = Mask("cp_step", 200, 150, part)
    want = full.dense()[200:400, 0:150]
    assert m.area == want.sum()
    bm = flex.to_block_mask(m, (32, 16))
    assert bm.seq_lengths == (200, 150)
    assert (flex.block_mask_dense(bm, 200, 150)[0] == want).all()

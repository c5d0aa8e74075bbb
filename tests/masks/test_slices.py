"""Slices: closed-form areas and rectangle counts against dense boolean masks."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from longca.masks import slices as sl

INF = 1 << 62


@st.composite
def bands(draw):
    sq = draw(st.integers(1, 40))
    sk = draw(st.integers(1, 40))
    q0 = draw(st.integers(0, sq - 1))
    q1 = draw(st.integers(q0 + 1, sq))
    k0 = draw(st.integers(0, sk - 1))
    k1 = draw(st.integers(k0 + 1, sk))
    lo = draw(st.one_of(st.just(-INF), st.integers(-45, 45)))
    hi = draw(st.one_of(st.just(INF), st.integers(-45, 45)))
    return sq, sk, (q0, q1, k0, k1, lo, hi)


def band_dense(sq, sk, q0, q1, k0, k1, lo, hi):
    q = np.arange(sq)[:, None]
    k = np.arange(sk)[None, :]
    return (q >= q0) & (q < q1) & (k >= k0) & (k < k1) & (k - q >= lo) & (k - q <= hi)


@settings(max_examples=150, deadline=None)
@given(bands())
def test_band_slices_match_definition_and_area(case):
    sq, sk, args = case
    s = sl.band_slices(*args)
    want = band_dense(sq, sk, *args)
    assert (sl.to_dense(s, sq, sk) == want).all()
    assert (sl.to_dense_tensor(s, sq, sk, "cpu", rows=7).numpy() == want).all()  # query rows in chunks
    assert sl.area(s) == want.sum()
    # slices never overlap: per-slice areas add up to the union
    assert sum(sl.to_dense(row[None], sq, sk).sum() for row in s) == want.sum()


@settings(max_examples=100, deadline=None)
@given(bands(), st.data())
def test_area_in_rect_and_clip_match_dense(case, data):
    sq, sk, args = case
    s = sl.band_slices(*args)
    dense = sl.to_dense(s, sq, sk)
    a = data.draw(st.integers(0, sq))
    b = data.draw(st.integers(a, sq))
    c = data.draw(st.integers(0, sk))
    d = data.draw(st.integers(c, sk))
    assert sl.area_in_rect(s, a, b, c, d).sum() == dense[a:b, c:d].sum()
    clipped = sl.clip_slices(s, a, b, c, d)
    want = np.zeros_like(dense)
    want[a:b, c:d] = dense[a:b, c:d]
    assert (sl.to_dense(clipped, sq, sk) == want).all()


def test_kinds_on_a_tall_and_a_wide_rectangle():
    # 3 x 5 (wide): CAUSAL is bottom-right aligned, so the last query sees all 5 keys.
    wide = sl.to_dense(sl.make_slices([(0, 3, 0, 5, sl.Kind.CAUSAL)]), 3, 5)
    assert wide.sum(axis=1).tolist() == [3, 4, 5]
    inv = sl.to_dense(sl.make_slices([(0, 3, 0, 5, sl.Kind.INVCAUSAL)]), 3, 5)
    assert inv.sum(axis=1).tolist() == [5, 4, 3]
    bi = sl.to_dense(sl.make_slices([(0, 3, 0, 5, sl.Kind.BICAUSAL)]), 3, 5)
    assert bi.sum(axis=1).tolist() == [3, 3, 3]
    # 5 x 3 (tall): the first two rows of a CAUSAL slice attend nothing; BICAUSAL is empty.
    tall = sl.make_slices([(0, 5, 0, 3, sl.Kind.CAUSAL), (0, 5, 0, 3, sl.Kind.BICAUSAL)])
    assert sl.slice_areas(tall).tolist() == [6, 0]
    assert sl.to_dense(tall[:1], 5, 3).sum(axis=1).tolist() == [0, 0, 1, 2, 3]


def test_key_bounds_agree_with_row_bounds():
    rows = sl.make_slices([(2, 9, 1, 12, k) for k in sl.Kind])
    for row in rows:
        q = np.arange(row[0], row[1])
        lo, hi = sl.key_bounds(np.repeat(row[None], len(q), axis=0), q)
        lo2, hi2 = sl.row_bounds(row, q)
        assert (np.maximum(hi, lo) - lo == np.maximum(hi2 - lo2, 0)).all()
        assert ((lo == lo2) | (hi == lo)).all()

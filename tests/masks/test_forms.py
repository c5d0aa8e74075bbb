"""Every form a pattern declares is produced and reproduces the dense mask."""

import numpy as np
import pytest

from longca.masks import flex, forms
from longca.masks.registry import PATTERNS, build_mask
from longca.masks.slices import to_dense

S = 203


def dense_from_varlen(v: forms.VarlenForm, n: int) -> np.ndarray:
    out = np.zeros((n, n), bool)
    for a, b in zip(v.cu_seqlens[:-1], v.cu_seqlens[1:]):
        blk = np.tril(np.ones((b - a, b - a), bool)) if v.causal else np.ones((b - a, b - a), bool)
        out[a:b, a:b] = blk
    return out


def dense_from_window(w: forms.WindowForm, n: int) -> np.ndarray:
    d = np.arange(n)[:, None] - np.arange(n)[None, :]  # q - k
    left = np.inf if w.left < 0 else w.left
    right = np.inf if w.right < 0 else w.right
    return (d <= left) & (-d <= right)


def dense_from_intervals(endpoints: np.ndarray, n: int) -> np.ndarray:
    """Query q sees [0, F0) U [F1, F2) U ... (cuDNN's interval-mask convention)."""
    assert endpoints.dtype == np.int32 and endpoints.shape[0] % 2 == 1
    assert (np.diff(endpoints.astype(np.int64), axis=0) >= 0).all()  # non-decreasing endpoints per query
    k = np.arange(n)[None, :]
    out = k < endpoints[0][:, None]
    for a, b in zip(endpoints[1::2], endpoints[2::2]):
        out |= (k >= a[:, None]) & (k < b[:, None])
    return out


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_each_declared_form_reproduces_the_dense_mask(name):
    params = {"window": 17} if "window" in {p.name for p in PATTERNS[name].params} else {}
    params = {} if name == "global_sliding_window" else params
    if PATTERNS[name].multi_document and name != "block_causal_document":
        params["distribution"] = "uniform"
    m = build_mask(name, S, params, seed=5, heads_kv=2 if PATTERNS[name].family == "dynamic" else None)
    dense = m.dense()
    for form in sorted(forms.forms_of(name)):
        got = forms.convert(m, form, block_size=32)
        if form == "dense":
            rebuilt = got
        elif form == "slices":
            rebuilt = to_dense(got, S, S)
        elif form == "full":
            rebuilt = np.ones((S, S), bool)
        elif form == "causal":
            rebuilt = np.tril(np.ones((S, S), bool))
        elif form == "window":
            rebuilt = dense_from_window(got, S)
        elif form == "varlen":
            rebuilt = dense_from_varlen(got, S)
            assert got.max_seqlen == max(np.diff(got.cu_seqlens))
        elif form == "blockmask":
            rebuilt = flex.block_mask_dense(got, S, S, heads=m.heads)
            rebuilt = rebuilt if m.per_head else rebuilt[0]
        elif form == "block_sparse":
            rebuilt = np.stack([to_dense(got.slices(h), S, S) for h in range(got.heads)])
        elif form == "intervals":
            rebuilt = dense_from_intervals(got, S)
        elif form == "document_intervals":
            docs, endpoints = got
            local, rebuilt = dense_from_intervals(endpoints, S), np.zeros((S, S), bool)
            for a, b in zip(docs.cu_seqlens[:-1], docs.cu_seqlens[1:]):  # each document's keys from its start
                rebuilt[a:b, a:b] = local[a:b, : b - a]
        else:
            raise AssertionError(f"untested form {form}")
        assert (rebuilt == dense).all(), form


@pytest.mark.parametrize("seqlen", [64, 1000, 4097])
@pytest.mark.parametrize("name", sorted(n for n, p in PATTERNS.items() if "intervals" in p.forms))
def test_interval_endpoints_reproduce_every_static_mask_over_draws(name, seqlen):
    params = {"window": 33} if "window" in {p.name for p in PATTERNS[name].params} else {}
    for sample in range(3):
        m = build_mask(name, seqlen, params, seed=1, sample=sample)
        got = forms.interval_form(m)
        assert (dense_from_intervals(got, seqlen) == m.dense()).all(), (name, sample)
    assert len([n for n, p in PATTERNS.items() if "intervals" in p.forms]) == 12  # every static mask


def test_interval_endpoints_merge_adjacent_intervals_and_pad_with_empty_ones():
    lo = np.array([[4, 0, 9], [0, 6, 2]])  # per layer (rows: 3 queries)
    hi = np.array([[6, 3, 9], [4, 8, 5]])  # row 0: [0,4) + [4,6) merge; row 1: [0,3), [6,8); row 2: [2,5)
    got = forms.interval_endpoints(lo, hi)
    assert got.tolist() == [[6, 3, 0], [6, 6, 2], [6, 8, 5]]


@pytest.mark.parametrize(
    "name, params",
    [
        ("causal_document", {"distribution": "uniform"}),
        ("full_document", {"distribution": "uniform"}),
        ("prefix_lm_document", {"distribution": "uniform"}),
        ("block_causal_document", {"block": 16}),
    ],
)
def test_documents_as_intervals_are_local_to_each_document(name, params):
    for sample in range(3):
        m = build_mask(name, 300, params, seed=3, sample=sample)
        docs, endpoints = forms.convert(m, "document_intervals")
        assert docs.cu_seqlens[-1] == 300 and list(np.diff(docs.cu_seqlens)) == list(m.documents)
        local = dense_from_intervals(endpoints, 300)  # keys counted from each query's document start
        dense = m.dense()
        for a, b in zip(docs.cu_seqlens[:-1], docs.cu_seqlens[1:]):  # each document is its own sequence
            assert (local[a:b, : b - a] == dense[a:b, a:b]).all(), (name, sample)
            assert not local[a:b, b - a :].any()
        assert docs.max_seqlen == max(m.documents)
    assert {n for n, p in PATTERNS.items() if "document_intervals" in p.forms} == {
        "full_document",
        "causal_document",
        "prefix_lm_document",
        "block_causal_document",
    }


def test_a_mask_that_attends_across_documents_has_no_document_form():
    m = build_mask("share_question", 64)  # answers see the question: not one sequence per document
    with pytest.raises(ValueError, match="attends across documents"):
        forms.document_interval_form(m)


def test_forms_a_mask_does_not_declare_are_refused():
    m = build_mask("share_question", 64)
    with pytest.raises(
        ValueError, match=r"cannot be given as form 'varlen'; allowed: \['blockmask', 'dense', 'intervals', 'slices'\]"
    ):
        forms.convert(m, "varlen")
    with pytest.raises(ValueError, match="has no window form"):
        forms.window_form(m)

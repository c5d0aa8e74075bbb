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
        else:
            raise AssertionError(f"untested form {form}")
        assert (rebuilt == dense).all(), form


def test_forms_a_mask_does_not_declare_are_refused():
    m = build_mask("share_question", 64)
    with pytest.raises(ValueError, match=r"cannot be given as form 'varlen'; allowed: \['blockmask', 'dense', 'slices'\]"):
        forms.convert(m, "varlen")
    with pytest.raises(ValueError, match="has no window form"):
        forms.window_form(m)

import torch

import longca.cp.lse as lse_module
from longca.cp.lse import combine, merge_


def _part(scores, v, a, b):
    s = scores[..., a:b]
    lse = torch.logsumexp(s, -1)
    p = torch.where(torch.isfinite(lse).unsqueeze(-1), torch.exp(s - lse.unsqueeze(-1)), 0.0)
    return p @ v[..., a:b, :], lse


def test_combination_equals_softmax_over_all_keys_and_keeps_empty_rows_finite():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 12, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 12, 4, generator=g, dtype=torch.float64)
    scores[..., 0, :] = float("-inf")  # a row with no key anywhere
    scores[..., 1, :6] = float("-inf")  # a row empty in the first part only
    out, lse = combine([_part(scores, v, 0, 6), _part(scores, v, 6, 12)])
    ref_out, ref_lse = _part(scores, v, 0, 12)
    assert torch.allclose(out, ref_out, atol=1e-14)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    assert torch.allclose(lse[..., 1:], ref_lse[..., 1:], atol=1e-14)
    assert not out.isnan().any() and (out[..., 0, :] == 0).all()


def test_merge_is_stable_for_large_logits():
    out = torch.zeros(1, 1, 1, 2)
    lse = torch.full((1, 1, 1), float("-inf"))
    merge_(out, lse, torch.tensor([[[[1.0, 0.0]]]]), torch.tensor([[[1000.0]]]))
    merge_(out, lse, torch.tensor([[[[0.0, 1.0]]]]), torch.tensor([[[1000.0]]]))
    # float32 holds lse = 1000.69 to ~6e-5, hence the tolerance; the point is no overflow or NaN.
    assert torch.allclose(out, torch.tensor([[[[0.5, 0.5]]]]), atol=1e-3)
    assert torch.allclose(lse, torch.tensor(1000.0 + 0.6931472), atol=1e-3)


def test_fused_merge_equals_the_eager_one_on_slice_views_and_empty_rows():
    """The compiled merge (what CUDA runs) against the eager formulas: float32 accumulators, a
    bfloat16 partial, a query-range view of the accumulators (as the sdpa local kernel merges
    into), rows empty in one part or in both."""
    g = torch.Generator().manual_seed(1)
    out0 = torch.randn(1, 4, 48, 16, generator=g)
    lse0 = torch.randn(1, 4, 48, generator=g)
    lse0[:, :, :5] = float("-inf")  # empty so far
    part = torch.randn(1, 4, 32, 16, generator=g).to(torch.bfloat16)
    lse_p = torch.randn(1, 4, 32, generator=g)
    lse_p[:, :, :3] = float("-inf")  # empty in both for rows 8..10 below
    results = []
    for fused in (False, True):
        out, lse = out0.clone(), lse0.clone()
        lse[:, :, 8:11] = float("-inf")
        merge_(out[:, :, 8:40], lse[:, :, 8:40], part, lse_p, fused=fused)
        results.append((out, lse))
    (eo, el), (fo, fl) = results
    assert lse_module._fused not in (None, False)  # the compiled path ran, no eager fallback
    assert torch.equal(torch.isinf(el), torch.isinf(fl))
    assert torch.allclose(fo, eo, atol=1e-6) and torch.allclose(fl[torch.isfinite(fl)], el[torch.isfinite(el)], atol=1e-6)
    assert torch.equal(fo[:, :, :8], out0[:, :, :8]) and torch.equal(fo[:, :, 40:], out0[:, :, 40:])
    assert (fo[:, :, 8:11] == 0).all() and not fo.isnan().any()

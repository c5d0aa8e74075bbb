import torch

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

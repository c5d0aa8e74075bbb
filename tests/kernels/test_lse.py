import torch

import longca.kernels.lse as lse_module
from longca.kernels.lse import Part, combine, combine_parts


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


def test_combination_is_stable_for_large_logits():
    parts = [
        Part(torch.tensor([[[[1.0, 0.0]]]]), torch.tensor([[[1000.0]]]), 0, 1),
        Part(torch.tensor([[[[0.0, 1.0]]]]), torch.tensor([[[1000.0]]]), 0, 1),
    ]
    out, lse = combine_parts(parts, (1, 1, 1, 2), torch.float32, torch.float32, torch.device("cpu"))
    # float32 holds lse = 1000.69 to ~6e-5, hence the tolerance; the point is no overflow or NaN.
    assert torch.allclose(out, torch.tensor([[[[0.5, 0.5]]]]), atol=1e-3)
    assert torch.allclose(lse, torch.tensor(1000.0 + 0.6931472), atol=1e-3)


def test_compiled_segment_pass_equals_the_eager_one():
    """The compiled pass (what CUDA runs) against the eager formulas: a float32 part and a bfloat16
    part over overlapping row ranges, rows empty in one part or in both, rows in no part."""
    g = torch.Generator().manual_seed(1)
    a = Part(torch.randn(1, 4, 40, 16, generator=g), torch.randn(1, 4, 40, generator=g), 0, 40)
    b = Part(torch.randn(1, 4, 32, 16, generator=g).to(torch.bfloat16), torch.randn(1, 4, 32, generator=g), 8, 40)
    a.lse[:, :, :5] = float("-inf")  # empty in a, outside b
    a.lse[:, :, 8:11] = float("-inf")  # empty in both
    b.lse[:, :, :3] = float("-inf")
    # a float32 output, as the old merge's accumulator, so both paths compare to the old 1e-6
    eager = combine_parts([a, b], (1, 4, 48, 16), torch.float32, torch.float32, torch.device("cpu"), fused=False)
    fused = combine_parts([a, b], (1, 4, 48, 16), torch.float32, torch.float32, torch.device("cpu"), fused=True)
    assert lse_module._fused_segment not in (None, False)  # the compiled path ran, no eager fallback
    (eo, el), (fo, fl) = eager, fused
    assert torch.equal(torch.isinf(el), torch.isinf(fl))
    assert torch.allclose(fo, eo, atol=1e-6) and torch.allclose(
        fl[torch.isfinite(fl)], el[torch.isfinite(el)], atol=1e-6
    )
    assert (fo[:, :, 8:11] == 0).all() and (fo[:, :, 40:] == 0).all() and not fo.isnan().any()
    assert torch.isinf(fl[:, :, 40:]).all() and torch.isfinite(fl[:, :, 11:40]).all()


# --------------------------------------------------------------------- parts over row ranges
from longca.kernels.lse import MAX_PENDING_PARTS, fold  # noqa: E402


def _row_part(scores, v, rows, keys, dtype=torch.float64):
    """The exact partial result of query rows [r0, r1) over key columns [c0, c1)."""
    (r0, r1), (c0, c1) = rows, keys
    o, l_ = _part(scores[..., r0:r1, :], v, c0, c1)
    return Part(o.to(dtype), l_, r0, r1)


def _reference(scores, v, cover):
    """Softmax over exactly the keys each row's parts cover (keys outside them masked)."""
    masked = torch.full_like(scores, float("-inf"))
    for (r0, r1), (c0, c1) in cover:
        masked[..., r0:r1, c0:c1] = scores[..., r0:r1, c0:c1]
    return _part(masked, v, 0, scores.shape[-1])


def test_parts_over_row_ranges_combine_to_the_softmax_of_their_keys():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(2, 3, 10, 16, generator=g, dtype=torch.float64)
    v = torch.randn(2, 3, 16, 4, generator=g, dtype=torch.float64)
    # rows 0-2 in no part; 2-6 one part; 4-10 a second part (overlap 4-6); 6-10 a third
    cover = [((2, 6), (0, 5)), ((4, 10), (5, 9)), ((6, 10), (9, 16))]
    parts = [_row_part(scores, v, r, c) for r, c in cover]
    out, lse = combine_parts(parts, (2, 3, 10, 4), torch.float64, torch.float64, torch.device("cpu"))
    ref_out, ref_lse = _reference(scores, v, cover)
    assert torch.allclose(out, ref_out, atol=1e-13)
    assert torch.allclose(lse[..., 2:], ref_lse[..., 2:], atol=1e-13)
    assert (out[..., :2, :] == 0).all() and torch.isinf(lse[..., :2]).all()


def test_parts_in_a_low_precision_dtype_are_combined_in_the_accumulator_and_written_once():
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(1, 2, 8, 12, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 12, 4, generator=g, dtype=torch.float64)
    cover = [((0, 8), (0, 6)), ((4, 8), (6, 12))]
    parts = [_row_part(scores, v, r, c, dtype=torch.bfloat16) for r, c in cover]
    out, lse = combine_parts(parts, (1, 2, 8, 4), torch.bfloat16, torch.float32, torch.device("cpu"))
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ref_out, _ = _reference(scores, v, cover)
    # one rounding of each part and one of the result: bf16's 2^-8, not an accumulation of them
    assert float((out.double() - ref_out).abs().max()) < 2 * 2**-8 * float(ref_out.abs().max()) + 1e-3


def test_one_part_over_every_row_is_returned_without_a_copy():
    o, l_ = torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5)
    out, lse = combine_parts([Part(o, l_, 0, 5)], (1, 2, 5, 3), torch.float32, torch.float32, torch.device("cpu"))
    assert out is o and lse is l_


def test_a_row_without_keys_in_its_only_part_gets_zero_even_if_the_kernel_left_garbage():
    o = torch.full((1, 1, 3, 2), float("nan"))
    l_ = torch.full((1, 1, 3), float("-inf"))
    out, lse = combine_parts([Part(o, l_, 1, 4)], (1, 1, 4, 2), torch.float32, torch.float32, torch.device("cpu"))
    assert (out == 0).all() and torch.isinf(lse).all()


def test_fold_bounds_the_pending_parts_and_keeps_the_result():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(1, 2, 6, 24, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 24, 4, generator=g, dtype=torch.float64)
    cover = [((0, 6), (4 * i, 4 * i + 4)) for i in range(6)]
    parts: list = []
    for r, c in cover:
        parts = fold(parts + [_row_part(scores, v, r, c)], (1, 2, 6, 4), torch.float64, torch.device("cpu"))
        assert len(parts) <= MAX_PENDING_PARTS
    out, _ = combine_parts(parts, (1, 2, 6, 4), torch.float64, torch.float64, torch.device("cpu"))
    assert torch.allclose(out, _reference(scores, v, cover)[0], atol=1e-13)

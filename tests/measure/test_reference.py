"""The high-precision reference: its dense mask (built with torch on the device) equals the numpy one,
its attention and error measure equal values worked out by hand."""

import math

import numpy as np
import pytest
import torch

from longca.masks.registry import STATIC, build_mask
from longca.measure.reference import dense_mask_tensor, error_ratio, error_sums, reference_attention, relative_error


@pytest.mark.parametrize("name", [*STATIC, "block_sparse", "variable_block_sparse"])
def test_dense_tensor_equals_numpy_dense(name):
    params = {"window": 100} if "sliding" in name else {"block": 64} if name == "block_sparse" else {}
    if name == "variable_block_sparse":
        params = {"min_block": 32, "mean_block": 96}
    mask = build_mask(name, 1000, params, seed=3, sample=1, heads_kv=2)
    want = mask.dense()
    want = want if want.ndim == 3 else want[None]
    # Small row chunks exercise the chunked path of every slice kind.
    got = dense_mask_tensor(mask, torch.device("cpu"))
    assert got.dtype == torch.bool and tuple(got.shape) == want.shape
    assert np.array_equal(got.numpy(), want)


# --- the reference attention and the error measure, against values worked out by hand ------------


def test_reference_attention_of_one_query_over_two_keys_by_hand():
    # q = [1, 0], keys [1, 0] and [0, 1], scale 1: scores 1 and 0, softmax e/(e+1) and 1/(e+1)
    q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)  # (B=1, Sq=1, H=1, D=2)
    k = torch.tensor([[[[1.0, 0.0]], [[0.0, 1.0]]]], dtype=torch.float64)  # (1, Sk=2, 1, 2)
    v = torch.tensor([[[[10.0, 0.0]], [[0.0, 20.0]]]], dtype=torch.float64)
    both = torch.ones(1, 1, 2, dtype=torch.bool)
    out = reference_attention(q, k, v, both, scale=1.0)
    e = math.e
    assert torch.allclose(out[0, 0, 0], torch.tensor([10 * e / (e + 1), 20 / (e + 1)], dtype=torch.float64))
    # the default scale is 1/sqrt(D): scores 1/sqrt(2) and 0
    w = math.exp(1 / math.sqrt(2))
    default = reference_attention(q, k, v, both)
    assert torch.allclose(default[0, 0, 0], torch.tensor([10 * w / (w + 1), 20 / (w + 1)], dtype=torch.float64))
    # the mask removes the first key: the output is the second value exactly
    second = torch.tensor([[[False, True]]])
    assert torch.equal(reference_attention(q, k, v, second, scale=1.0)[0, 0, 0], v[0, 1, 0])
    # a row with no key gives zeros, not NaN
    assert torch.equal(reference_attention(q, k, v, torch.zeros(1, 1, 2, dtype=torch.bool))[0, 0, 0], torch.zeros(2))


def test_reference_attention_gqa_chunks_and_per_head_masks():
    g = torch.Generator().manual_seed(0)
    b, s, hq, hkv, d = 2, 7, 4, 2, 3
    q = torch.randn(b, s, hq, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, s, hkv, d, generator=g, dtype=torch.float64) for _ in range(2))
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    per_head = torch.stack([causal, causal.T])  # KV head 0 causal, head 1 anti-causal
    out = reference_attention(q, k, v, per_head, q_chunk=3)  # chunks of 3, 3 and 1 rows
    for h in range(hq):
        kv = h // (hq // hkv)  # query heads 0, 1 use KV head 0; 2, 3 use KV head 1
        scores = q[:, :, h] @ k[:, :, kv].transpose(1, 2) / math.sqrt(d)
        scores = scores.masked_fill(~per_head[kv], float("-inf"))
        want = torch.softmax(scores, -1) @ v[:, :, kv]
        assert torch.allclose(out[:, :, h], want)


def test_relative_error_by_hand():
    ref = torch.tensor([[3.0, 4.0]])  # norm 5
    assert relative_error(torch.tensor([[3.0, 4.0]]), ref) == 0.0
    assert relative_error(torch.tensor([[3.0, 1.0]]), ref) == pytest.approx(3 / 5)
    assert relative_error(torch.tensor([[0.0, 0.0]]), ref) == pytest.approx(1.0)
    # where the reference is zero, the difference's norm
    assert relative_error(torch.tensor([[6.0, 8.0]]), torch.zeros(1, 2)) == pytest.approx(10.0)
    for bad in (float("nan"), float("inf"), float("-inf")):
        assert relative_error(torch.tensor([[3.0, bad]]), ref) == float("inf")
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(torch.zeros(2, 2), torch.zeros(2, 3))


def test_error_sums_are_the_same_in_any_chunks_and_add_over_parts():
    g = torch.Generator().manual_seed(1)
    x, ref = (torch.randn(3, 10, 4, generator=g, dtype=torch.float64) for _ in range(2))
    want_num = float(((x - ref) ** 2).sum())
    want_den = float((ref**2).sum())
    for chunk in (1, 5, 12, 13, 1 << 24):  # 12 elements per step along dim 1
        num, den = error_sums(x, ref, chunk_elems=chunk)
        assert num == pytest.approx(want_num) and den == pytest.approx(want_den)
    halves = [error_sums(x[..., :2], ref[..., :2]), error_sums(x[..., 2:], ref[..., 2:])]
    assert sum(h[0] for h in halves) == pytest.approx(want_num)
    assert error_ratio(want_num, want_den) == pytest.approx(math.sqrt(want_num / want_den))
    one_d = error_sums(torch.tensor([1.0, 2.0, 2.0]), torch.zeros(3), chunk_elems=1)
    assert one_d == (9.0, 0.0)
    assert error_sums(torch.tensor(2.0), torch.tensor(1.0)) == (1.0, 1.0)  # a 0-d tensor
    nan_late = x.clone()
    nan_late[2, 9, 3] = float("nan")  # in the last chunk
    assert error_sums(nan_late, ref, chunk_elems=12) == (float("inf"), float("inf"))
    assert error_ratio(float("inf"), float("inf")) == float("inf")

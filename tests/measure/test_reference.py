"""The reference's dense mask is built with torch on the device; it must equal the numpy one."""

import numpy as np
import pytest
import torch

from longca.masks.registry import STATIC, build_mask
from longca.measure.reference import dense_mask_tensor


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

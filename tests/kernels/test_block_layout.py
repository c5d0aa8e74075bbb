"""`block_layout`: what every block-sparse adapter checks in prepare, on the CPU."""

from __future__ import annotations

import re

import pytest

from longca.kernels import registry
from longca.kernels.base import Unsupported, block_layout
from longca.masks.registry import build_mask


def test_a_block_sparse_kernel_gets_the_layout_or_the_reason_why_not():
    fa2, flashinfer = registry.get("block_sparse_fa2"), registry.get("flashinfer_block_sparse")
    b128 = build_mask("block_sparse", 512, {"block": 128, "density": 0.5}, seed=1, heads_kv=2)
    b64 = build_mask("block_sparse", 512, {"block": 64, "density": 0.5}, seed=1, heads_kv=2)
    variable = build_mask(
        "variable_block_sparse", 512, {"density": 0.5, "min_block": 64, "mean_block": 128}, seed=1, heads_kv=2
    )
    assert block_layout(fa2, b128, "block_sparse", 4, 2) is b128.blocks
    assert block_layout(flashinfer, variable, "block_sparse", 4, 2) is variable.blocks  # any blocks
    for kernel, mask, form, hq, hkv, why in (
        (fa2, b64, "block_sparse", 4, 2, "uniform blocks of [128] only; this layout has 64 blocks"),
        (fa2, variable, "block_sparse", 4, 2, "this layout has variable blocks"),
        (fa2, b128, "dense", 4, 2, "takes a block-sparse layout"),
        (flashinfer, b128, "block_sparse", 4, 4, "mask has 2 KV heads"),
        (flashinfer, build_mask("causal", 512), "block_sparse", 4, 2, "takes a block-sparse layout"),
        (registry.get("vsa_triton"), b64, "block_sparse", 4, 2, "GQA (heads_q != heads_kv) not supported"),
    ):
        with pytest.raises(Unsupported, match=re.escape(why)):
            block_layout(kernel, mask, form, hq, hkv)

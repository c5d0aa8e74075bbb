"""The "block_sparse_fa2" adapter (MIT Han Lab's block-sparse FlashAttention-2, source-only).

Where the package is absent (this CI, the H200 host) its cells are `unsupported` rows with the
reason; its fixed 128 x 128 tile is a declared capability the planner enforces. With the package and
a GPU, forward and gradients (GQA through repeated K/V heads) are checked against the reference.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from longca.kernels import registry
from longca.masks.registry import build_mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error
from longca.run.serving import planned_unsupported, runtime_unsupported
from longca.spec.cells import expand
from longca.spec.load import load_spec

HAVE_PACKAGE = importlib.util.find_spec("block_sparse_attn") is not None
ON_GPU = torch.cuda.is_available() and HAVE_PACKAGE


def _cells(masks: str):
    return expand(
        load_spec(
            text=f"""
name: t
device: cuda
kernels: [block_sparse_fa2]
masks: {masks}
seqlens: [1024]
heads: ["8:2", "8:8"]
head_dims: [128]
dtypes: [bfloat16]
passes: [fwd, bwd]
sweeps: [{{name: s}}]
"""
        )
    )


def test_only_uniform_128_blocks_are_planned():
    assert {planned_unsupported(c) for c in _cells("[{name: block_sparse, block: 128, density: 0.5}]")} == {None}
    assert {planned_unsupported(c) for c in _cells("[{name: block_sparse, block: 64, density: 0.5}]")} == {
        "block size 64 not supported (uniform blocks of [128] only)"
    }
    assert {planned_unsupported(c) for c in _cells("[{name: variable_block_sparse, density: 0.5}]")} == {
        "variable blocks not supported (uniform blocks of [128] only)"
    }


@pytest.mark.skipif(HAVE_PACKAGE, reason="checks the reason given where block_sparse_attn is absent")
def test_without_the_package_a_gpu_cell_is_unsupported_with_the_reason():
    cell = _cells("[{name: block_sparse, block: 128, density: 0.5}]")[0]
    assert runtime_unsupported(cell, torch.device("cuda")) == "block_sparse_attn not installed"


@pytest.mark.skipif(
    not ON_GPU,
    reason="block_sparse_attn needs a CUDA GPU and its own CUDA build, which the lent GPU hosts never "
    "have (source only; no compiler toolchain or network there)",
)
@pytest.mark.parametrize("hq, hkv", [(4, 4), (8, 2)])
def test_forward_and_gradients_match_the_reference(hq, hkv):
    s, d, b = 1024, 128, 2
    mask = build_mask("block_sparse", s, {"block": 128, "density": 0.4}, seed=2, heads_kv=hkv)
    prepared = registry.get("block_sparse_fa2").prepare(
        mask,
        batch=b,
        heads_q=hq,
        heads_kv=hkv,
        head_dim=d,
        dtype=torch.bfloat16,
        device=torch.device("cuda"),
        form="block_sparse",
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(b, s, hq, d, device="cuda", generator=g) for _ in range(2))
    k, v = (torch.randn(b, s, hkv, d, device="cuda", generator=g) for _ in range(2))
    for t in (q, k, v):
        t.requires_grad_(True)
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cuda")))
    ref.backward(do)
    mine = [t.detach().to(torch.bfloat16).requires_grad_(True) for t in (q, k, v)]
    out = prepared.call(*mine)
    out.backward(do.to(torch.bfloat16))
    assert relative_error(out.float(), ref) < 2e-2
    for m, r in zip(mine, (q, k, v)):
        assert relative_error(m.grad.float(), r.grad) < 5e-2

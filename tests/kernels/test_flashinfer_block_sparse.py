"""The "flashinfer_block_sparse" adapter (FlashInfer's variable block-sparse wrapper, forward only).

Where FlashInfer is absent (this CI, the project's H200 host) its cells must be `unsupported` rows
with the reason, never a crash; with FlashInfer and a GPU the forward is checked against the
float32 reference for uniform and variable blocks under GQA.
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

HAVE_FLASHINFER = importlib.util.find_spec("flashinfer") is not None
ON_GPU = torch.cuda.is_available() and HAVE_FLASHINFER


def _cells(device: str = "cuda"):
    return expand(
        load_spec(
            text=f"""
name: t
device: {device}
kernels: [flashinfer_block_sparse]
masks: [{{name: block_sparse, block: 128, density: 0.5}}, {{name: variable_block_sparse, density: 0.5}}]
seqlens: [1024]
heads: ["8:2"]
head_dims: [128]
dtypes: [bfloat16]
passes: [fwd, bwd]
sweeps: [{{name: s}}]
"""
        )
    )


def test_forward_cells_are_planned_for_any_blocks_and_backward_cells_are_not():
    by_pass = {}
    for c in _cells():
        by_pass.setdefault(c.pass_, set()).add(planned_unsupported(c))
    assert by_pass["fwd"] == {None}  # uniform and variable blocks, GQA: all planned to run
    assert by_pass["bwd"] == {"no backward pass"}


@pytest.mark.skipif(HAVE_FLASHINFER, reason="checks the reason given where flashinfer is absent")
def test_without_flashinfer_a_gpu_cell_is_unsupported_with_the_reason():
    fwd = next(c for c in _cells() if c.pass_ == "fwd")
    assert runtime_unsupported(fwd, torch.device("cuda")) == "flashinfer not installed"


@pytest.mark.skipif(
    not ON_GPU,
    reason="FlashInfer's kernels need a CUDA GPU and the flashinfer package, which the lent GPU hosts "
    "never have (about 150 MiB, kernels compiled at run time, no network there)",
)
@pytest.mark.parametrize(
    "mask_name, params",
    [
        ("block_sparse", {"block": 64, "density": 0.3}),
        ("variable_block_sparse", {"density": 0.5, "min_block": 64, "mean_block": 192}),
    ],
)
def test_forward_matches_the_reference(mask_name, params):
    s, hq, hkv, d = 1024, 8, 2, 128
    mask = build_mask(mask_name, s, params, seed=5, heads_kv=hkv)
    prepared = registry.get("flashinfer_block_sparse").prepare(
        mask,
        batch=1,
        heads_q=hq,
        heads_kv=hkv,
        head_dim=d,
        dtype=torch.bfloat16,
        device=torch.device("cuda"),
        form="block_sparse",
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, s, hq, d, device="cuda", generator=g)
    k, v = (torch.randn(1, s, hkv, d, device="cuda", generator=g) for _ in range(2))
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cuda")))
    out = prepared.call(*(t.to(torch.bfloat16).transpose(1, 2).contiguous() for t in (q, k, v)))
    assert relative_error(out.transpose(1, 2).float(), ref) < 2e-2

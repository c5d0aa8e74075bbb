"""The "vsa_triton" adapter (VSA's Triton block-sparse kernel, loaded from the `vsa` package's files).

What it declares is checked everywhere: the planner marks block sizes other than 64, variable blocks
and GQA `unsupported` with the reason, and a missing package is an `unsupported` row, never a crash.
The kernel itself needs a GPU (its forward is autotuned, which Triton's CPU interpreter cannot run)
and the `vsa` wheel (CPython 3.12 only); with both, forward and gradients are checked against the
float32 reference.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from longca.kernels import registry
from longca.kernels.base import Unsupported
from longca.masks.registry import build_mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error
from longca.run.cell import run_cell
from longca.run.serving import planned_unsupported
from longca.spec.cells import expand
from longca.spec.load import load_spec

HAVE_VSA = importlib.util.find_spec("vsa") is not None
ON_GPU = torch.cuda.is_available() and HAVE_VSA


def _cells(masks: str, heads: str = '["4:4"]', device: str = "cuda"):
    return expand(
        load_spec(
            text=f"""
name: t
device: {device}
kernels: [vsa_triton]
masks: {masks}
seqlens: [512]
heads: {heads}
head_dims: [64]
dtypes: [bfloat16]
passes: [fwd, bwd]
sweeps: [{{name: s}}]
"""
        )
    )


def test_the_planner_takes_only_uniform_64_blocks_without_gqa():
    ok = _cells("[{name: block_sparse, block: 64, density: 0.5}]")
    assert all(planned_unsupported(c) is None for c in ok)
    for masks, heads, want in (
        (
            "[{name: block_sparse, block: 128, density: 0.5}]",
            '["4:4"]',
            "block size 128 not supported (uniform blocks of [64] only)",
        ),
        (
            "[{name: variable_block_sparse, density: 0.5, min_block: 64, mean_block: 128}]",
            '["4:4"]',
            "variable blocks not supported (uniform blocks of [64] only)",
        ),
        ("[{name: block_sparse, block: 64, density: 0.5}]", '["4:2"]', "GQA (heads_q != heads_kv) not supported"),
        ("[causal]", '["4:4"]', "mask causal offers forms"),
    ):
        reasons = {planned_unsupported(c) for c in _cells(masks, heads)}
        assert len(reasons) == 1 and reasons.pop().startswith(want), (masks, heads)


def test_other_block_sparse_kernels_keep_any_block():
    # block_sizes is None for longca's Triton kernel and Flex: variable and 128 blocks stay runnable.
    for kernel in ("triton_block_sparse", "flex"):
        assert registry.get(kernel).caps.block_sizes is None


@pytest.mark.skipif(HAVE_VSA, reason="checks the row of a machine without the vsa package")
def test_without_the_package_the_cell_is_an_unsupported_row():
    cell = _cells("[{name: block_sparse, block: 64, density: 0.5}]", device="cpu")[0]
    (row,) = run_cell(cell)
    assert row["status"] == "unsupported" and "cuda" in row["reason"]  # planned: CPU is not a VSA device
    kernel = registry.get("vsa_triton")
    mask = build_mask("block_sparse", 512, {"block": 64, "density": 0.5}, seed=0, heads_kv=4)
    with pytest.raises(Unsupported, match="vsa not installed"):
        kernel.prepare(
            mask,
            batch=1,
            heads_q=4,
            heads_kv=4,
            head_dim=64,
            dtype=torch.bfloat16,
            device=torch.device("cpu"),
            form="block_sparse",
        )


@pytest.mark.skipif(not ON_GPU, reason="VSA's Triton kernel needs a CUDA GPU and the vsa wheel")
@pytest.mark.parametrize("density", [0.2, 0.5])
def test_forward_and_gradients_match_the_reference(density):
    s, h, d = 1024, 4, 64
    mask = build_mask("block_sparse", s, {"block": 64, "density": density}, seed=3, heads_kv=h)
    prepared = registry.get("vsa_triton").prepare(
        mask,
        batch=2,
        heads_q=h,
        heads_kv=h,
        head_dim=d,
        dtype=torch.bfloat16,
        device=torch.device("cuda"),
        form="block_sparse",
    )
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(2, s, h, d, device="cuda", generator=g) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cuda")))
    ref.backward(do)
    mine = [t.detach().to(torch.bfloat16).transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v)]
    out = prepared.call(*mine)
    out.backward(do.to(torch.bfloat16).transpose(1, 2))
    assert relative_error(out.transpose(1, 2).float(), ref) < 2e-2
    for mine_t, ref_t in zip(mine, (q, k, v)):
        assert relative_error(mine_t.grad.transpose(1, 2).float(), ref_t.grad) < 5e-2

"""cuDNN's block-sparse attention (`cudnn_block_sparse`): its capabilities as data, the block lists it
is handed (derived from the mask's BlockLayout, checked against the dense mask), planning of what it
cannot serve, and on the CPU rows `unsupported` with the reason. With CUDA (sm90+) and the package,
forward and gradients against the float32 reference (run on the H200)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from longca.kernels import registry
from longca.kernels.adapters.cudnn_block_sparse import block_index_form
from longca.kernels.base import choose_form
from longca.masks.blocks import BlockLayout
from longca.masks.forms import forms_of
from longca.masks.registry import build_mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error
from longca.run.cell import run_cell
from longca.run.serving import planned_unsupported
from longca.spec.cells import expand
from longca.spec.load import load_spec


def _spec(device: str, heads: str = '["4:2", "4:4"]', head_dims: str = "[64, 128]", dtypes: str = "[bfloat16]"):
    return load_spec(
        text=f"""
name: t
device: {device}
kernels: [cudnn_block_sparse]
masks:
  - {{name: block_sparse, block: 64, density: 0.5}}
  - {{name: block_sparse, block: 128, density: 0.5}}
  - {{name: block_sparse, block: 256, density: 0.5}}
  - {{name: variable_block_sparse, density: 0.5, min_block: 64, mean_block: 128}}
seqlens: [1024]
heads: {heads}
head_dims: {head_dims}
dtypes: {dtypes}
passes: [fwd, bwd]
check: {{max_seqlen: 1024}}
sweeps: [{{name: s}}]
"""
    )


def test_capabilities_are_the_librarys_limits_as_data():
    caps = registry.get("cudnn_block_sparse").caps
    assert caps.mask_forms == frozenset({"block_sparse"}) and caps.package == "cudnn.block_sparse_attention"
    assert caps.block_sizes == frozenset({64, 128}) and caps.head_dims == frozenset({64, 96, 128})
    assert caps.dtypes == frozenset({"float16", "bfloat16"}) and caps.min_compute_capability == (9, 0)
    # the backward: bf16, MHA, head dim 128 (the library's sm90 limits)
    assert caps.backward_reason(dtype="bfloat16", head_dim=128, gqa=False) is None
    assert "MHA only" in caps.backward_reason(dtype="bfloat16", head_dim=128, gqa=True)
    assert "head dim 64" in caps.backward_reason(dtype="bfloat16", head_dim=64, gqa=False)
    assert "float16" in caps.backward_reason(dtype="float16", head_dim=128, gqa=False)
    assert choose_form(caps, forms_of("block_sparse")) == "block_sparse"


@pytest.mark.parametrize("block", [64, 128])
def test_block_lists_reproduce_the_dense_mask_per_query_head(block):
    heads_q, heads_kv, s = 6, 2, 1024
    mask = build_mask("block_sparse", s, {"block": block, "density": 0.3}, seed=3, heads_kv=heads_kv)
    index, counts = block_index_form(mask.blocks, heads_q)
    nq = s // block
    assert index.shape[:2] == (heads_q, nq) and index.dtype == np.int32 and counts.dtype == np.int32
    dense = dense_mask_tensor(mask, torch.device("cpu")).numpy()  # (heads_kv, S, S)
    for h in range(heads_q):
        rebuilt = np.zeros((s, s), dtype=bool)
        for i in range(nq):
            ids = index[h, i, : counts[h, i]]
            assert (np.diff(ids) > 0).all()  # ascending, no repeats
            for j in ids:
                rebuilt[i * block : (i + 1) * block, j * block : (j + 1) * block] = True
        np.testing.assert_array_equal(rebuilt, dense[h // (heads_q // heads_kv)])


def test_unequal_rows_are_padded_with_their_last_id_and_counted():
    kept = np.array([[[True, False, True, False], [False, True, False, False]]])
    layout = BlockLayout(np.array([0, 64, 128]), np.arange(0, 257, 64), kept, uniform_block=64)
    index, counts = block_index_form(layout, 2)
    np.testing.assert_array_equal(counts, [[2, 1], [2, 1]])
    np.testing.assert_array_equal(index[0], [[0, 2], [1, 1]])
    two_heads = BlockLayout(layout.q_bounds, layout.k_bounds, np.concatenate([kept, kept]), uniform_block=64)
    with pytest.raises(ValueError, match="not a multiple"):
        block_index_form(two_heads, 3)
    empty = BlockLayout(layout.q_bounds, layout.k_bounds, np.zeros_like(kept), uniform_block=64)
    with pytest.raises(ValueError, match="at least one key block"):
        block_index_form(empty, 1)


def test_planning_marks_what_the_library_refuses():
    cells = expand(_spec("cuda", head_dims="[64, 128, 256]", dtypes="[bfloat16, float16]"))
    reasons = {
        (dict(c.mask_params).get("block"), c.heads_q, c.heads_kv, c.head_dim, c.dtype, c.pass_): planned_unsupported(c)
        for c in cells
    }
    assert reasons[(64, 4, 2, 64, "bfloat16", "fwd")] is None  # GQA forward
    assert reasons[(128, 4, 4, 128, "bfloat16", "bwd")] is None  # MHA backward at head dim 128
    assert "MHA only" in reasons[(128, 4, 2, 128, "bfloat16", "bwd")]
    assert "head dim 64" in reasons[(64, 4, 4, 64, "bfloat16", "bwd")]
    assert "no backward in float16" in reasons[(64, 4, 4, 128, "float16", "bwd")]
    assert "head dim 256 not supported" in reasons[(64, 4, 4, 256, "bfloat16", "fwd")]
    assert "block size 256 not supported" in reasons[(256, 4, 4, 128, "bfloat16", "fwd")]
    variable = [
        planned_unsupported(c)
        for c in cells
        if c.mask == "variable_block_sparse" and c.pass_ == "fwd" and c.head_dim < 256
    ]
    assert variable and all("variable blocks not supported" in r for r in variable)


def test_on_the_cpu_every_cell_is_an_unsupported_row_with_the_reason():
    rows = [r for c in expand(_spec("cpu")) for r in run_cell(c)]
    assert rows and {r["status"] for r in rows} == {"unsupported"}
    assert "kernel runs on ['cuda'], not cpu" in {r["reason"] for r in rows}


def _ready() -> bool:
    caps = registry.get("cudnn_block_sparse").caps
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < caps.min_compute_capability:
        return False
    try:
        return importlib.util.find_spec(caps.package) is not None
    except ImportError:
        return False


@pytest.mark.parametrize(("block", "heads_kv"), [(64, 2), (128, 2), (64, 4), (128, 4)])
def test_matches_the_reference_on_a_gpu(block, heads_kv):
    if not _ready():
        pytest.skip("cudnn_block_sparse needs CUDA (sm90+) and nvidia-cudnn-frontend")
    torch.manual_seed(0)
    device, s, hq, d = torch.device("cuda"), 2048, 4, 128
    mask = build_mask("block_sparse", s, {"block": block, "density": 0.5}, seed=0, heads_kv=heads_kv)
    kernel = registry.get("cudnn_block_sparse")
    prep = kernel.prepare(
        mask,
        batch=2,
        heads_q=hq,
        heads_kv=heads_kv,
        head_dim=d,
        dtype=torch.bfloat16,
        device=device,
        form="block_sparse",
    )
    q, k, v, do = (torch.randn(2, h, s, d, device=device) for h in (hq, heads_kv, heads_kv, hq))
    bshd = lambda x: x.transpose(1, 2)  # noqa: E731
    ref_in = [bshd(x).clone().requires_grad_(True) for x in (q, k, v)]
    ref = reference_attention(*ref_in, dense_mask_tensor(mask, device))
    mine = [x.to(torch.bfloat16).requires_grad_(True) for x in (q, k, v)]
    out = prep.call(*mine)
    assert relative_error(bshd(out), ref) < 3e-2
    if heads_kv == hq:  # the library's backward is MHA-only
        ref.backward(bshd(do))
        out.backward(do.to(torch.bfloat16))
        for a, b in zip(mine, ref_in):
            assert relative_error(bshd(a.grad), b.grad) < 9e-2

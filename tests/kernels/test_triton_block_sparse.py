"""longca's Triton block-sparse attention against a float64 dense-mask reference.

Without a GPU the kernels run in Triton's CPU interpreter (TRITON_INTERPRET=1, float32 inputs,
tiny shapes); with one they run on it in float16. Kernel tests are skipped only when Triton is not
importable; the index-table tests need no Triton.
"""

from __future__ import annotations

import importlib
import math
import os

import numpy as np
import pytest
import torch

from longca.kernels.base import package_available
from longca.kernels.triton_sparse.plan import KernelConfig, TileConfig, build_plan, make_csr, make_tiles, tile_sizes
from longca.masks.blocks import BlockLayout
from longca.masks.mask import Mask

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # read when kernels are decorated (module import)
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPE = torch.float16 if ON_GPU else torch.float32
TOL = 2e-2 if ON_GPU else 1e-4
if os.environ.get("LONGCA_REQUIRE_TRITON") == "1" and not package_available("triton"):
    raise RuntimeError("LONGCA_REQUIRE_TRITON=1 (CI) but triton is not importable: the kernel tests would skip")
needs_triton = pytest.mark.skipif(not package_available("triton"), reason="triton is not importable")
SMALL = KernelConfig(TileConfig(32, 16), TileConfig(16, 32), TileConfig(32, 16))


def kernels():
    """The kernel modules, re-imported if something imported them before the interpreter was on."""
    from triton.runtime.interpreter import InterpretedFunction

    from longca.kernels.triton_sparse import api, backward, forward

    if not ON_GPU and not isinstance(forward._fwd_kernel, InterpretedFunction):
        for mod in (forward, backward, api):
            importlib.reload(mod)
    return api


def reference(q, k, v, layout: BlockLayout):
    """float64 softmax attention under the layout's dense mask; rows with no key give 0."""
    g = q.shape[1] // k.shape[1]
    rq, rk = np.diff(layout.q_bounds), np.diff(layout.k_bounds)
    dense = np.repeat(np.repeat(layout.kept, rq, axis=1), rk, axis=2)
    allowed = torch.as_tensor(dense).repeat_interleave(g, 0)
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v, lse


def inputs(b, hq, hkv, sq, sk, d, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mk = lambda h, s: torch.randn(b, h, s, d, generator=gen, dtype=torch.float64)  # noqa: E731
    return mk(hq, sq), mk(hkv, sk), mk(hkv, sk), mk(hq, sq)


def run_and_compare(layout: BlockLayout, config: KernelConfig, b=1, hq=4, hkv=2, d=16):
    api = kernels()
    sq, sk = int(layout.q_bounds[-1]), int(layout.k_bounds[-1])
    q64, k64, v64, do64 = inputs(b, hq, hkv, sq, sk, d)
    plan = build_plan(layout, DEVICE, config)
    q, k, v = (t.to(DEVICE, DTYPE).requires_grad_() for t in (q64, k64, v64))
    out, lse = api.block_sparse_attn_fwd(q.detach(), k.detach(), v.detach(), plan)
    out_ag = api.block_sparse_attention(q, k, v, plan)
    out_ag.backward(do64.to(DEVICE, DTYPE))
    ref_in = [t.clone().requires_grad_() for t in (q64, k64, v64)]
    ref_out, ref_lse = reference(*ref_in, layout)
    ref_out.backward(do64)
    got = {"out": out, "out_autograd": out_ag.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}
    want = {"out": ref_out, "out_autograd": ref_out, "dq": ref_in[0].grad, "dk": ref_in[1].grad, "dv": ref_in[2].grad}
    for name in got:
        assert torch.isfinite(got[name]).all(), name
        torch.testing.assert_close(got[name].double().cpu(), want[name].detach(), atol=TOL, rtol=TOL, msg=name)
    lse = lse.double().cpu()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=TOL, rtol=TOL)
    return plan, got


# ---- index tables (no Triton needed) ----


def test_tiles_cut_blocks_with_ragged_last_tiles():
    t = make_tiles(np.array([0, 20, 64, 100]), 16, torch.device("cpu"))
    assert t.start.tolist() == [0, 16, 20, 36, 52, 64, 80, 96]
    assert t.end.tolist() == [16, 20, 36, 52, 64, 80, 96, 100]
    assert t.block.tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    assert not t.even
    assert make_tiles(np.array([0, 32, 64]), 16, torch.device("cpu")).even


def test_csr_rows_and_transpose():
    kept = np.array([[[1, 0, 1], [0, 0, 0]], [[0, 1, 0], [1, 1, 1]]], dtype=bool)  # 2 heads, 2 x 3 blocks
    rows = make_csr(kept, torch.device("cpu"))
    assert rows.ptr.tolist() == [0, 2, 2, 3, 6]
    assert rows.idx.tolist() == [0, 2, 1, 0, 1, 2]
    cols = make_csr(kept.transpose(0, 2, 1), torch.device("cpu"))
    assert cols.ptr.tolist() == [0, 1, 1, 2, 3, 5, 6]
    assert cols.idx.tolist() == [0, 0, 1, 0, 1, 1]


def test_tiles_shrink_to_divide_uniform_blocks():
    def lay(block):
        n = 4
        return BlockLayout(np.arange(n + 1) * block, np.arange(n + 1) * block, np.ones((1, n, n), bool), block)

    assert tile_sizes(lay(64), TileConfig(128, 128)) == (64, 64)
    assert tile_sizes(lay(48), TileConfig(128, 64)) == (16, 16)
    assert tile_sizes(lay(128), TileConfig(128, 64)) == (128, 64)
    assert build_plan(lay(64), "cpu", KernelConfig(TileConfig(128, 128))).fast_path
    # blocks that are not multiples of 16 fall back to masked tiles
    assert not build_plan(lay(40), "cpu").fast_path


def test_config_text_round_trips_through_parse_config():
    from longca.kernels.triton_sparse.configs import parse_config

    cfg = KernelConfig(TileConfig(128, 64, 8, 3), TileConfig(32, 64, 4, 3), TileConfig(64, 32, 4, 2))
    assert cfg.as_text() == "fwd=128,64,8,3;dkdv=32,64,4,3;dq=64,32,4,2"
    assert parse_config(cfg.as_text()) == cfg
    tma = KernelConfig(cfg.fwd, cfg.dkdv, cfg.dq, fwd_kernel="tma_ws")
    assert tma.as_text() == cfg.as_text() + ";fwd_kernel=tma_ws"
    assert parse_config(tma.as_text()) == tma
    with pytest.raises(ValueError, match="fwd_kernel"):
        parse_config("fwd_kernel=wgmma")


def test_plan_rejects_mismatched_layout():
    bad = BlockLayout(np.array([0, 32, 64]), np.array([0, 64]), np.ones((1, 3, 1), bool), None)
    with pytest.raises(ValueError, match="does not match"):
        build_plan(bad, "cpu")


# ---- kernels ----


@needs_triton
def test_uniform_blocks_gqa_with_empty_rows_and_columns():
    rng = np.random.default_rng(1)
    nb = 4
    kept = rng.random((2, nb, nb)) < 0.5
    kept[0, 1, :] = False  # query block with no key block: output 0, lse -inf
    kept[1, :, 2] = False  # key block nobody attends: dk = dv = 0
    kept[1, 0, 0] = True
    layout = BlockLayout(np.arange(nb + 1) * 32, np.arange(nb + 1) * 32, kept, 32)
    plan, got = run_and_compare(layout, SMALL)
    assert plan.fast_path
    assert (got["out"][:, 0:2, 32:64] == 0).all() and (got["dq"][:, 0:2, 32:64] == 0).all()
    assert (got["dk"][:, 1, 64:96] == 0).all() and (got["dv"][:, 1, 64:96] == 0).all()


def _two_blocks(block: int) -> BlockLayout:
    """2 x 2 uniform blocks of `block` tokens, random kept blocks (column 0 always kept)."""
    rng = np.random.default_rng(block)
    kept = rng.random((1, 2, 2)) < 0.6
    kept[0, :, 0] = True
    bounds = np.arange(3) * block
    return BlockLayout(bounds, bounds, kept, block)


@needs_triton
@pytest.mark.parametrize("block", [64, 128])
def test_blocks_64_and_128_with_larger_tiles(block):
    cfg = KernelConfig(TileConfig(64, 32), TileConfig(32, 64), TileConfig(64, 32))
    plan, _ = run_and_compare(_two_blocks(block), cfg, hq=2, hkv=1, d=32)
    assert plan.fast_path


@needs_triton
def test_variable_blocks_ragged_edges_and_unequal_lengths():
    # block sizes not multiples of the tiles (or of 16), seqlen_q != seqlen_k
    qb = np.array([0, 20, 64, 70, 96])
    kb = np.array([0, 48, 50, 112, 128])
    rng = np.random.default_rng(3)
    kept = rng.random((2, 4, 4)) < 0.5
    kept[1, 2, :] = False
    kept[0, 0, 1] = True
    plan, got = run_and_compare(BlockLayout(qb, kb, kept, None), SMALL)
    assert not plan.fast_path
    assert (got["out"][:, 2:4, 64:70] == 0).all()


@needs_triton
def test_backward_from_merged_out_and_lse_splits_gradients_exactly():
    """Ring-attention use: two key halves run separately, merged by LSE; each half's backward from
    the merged (out, lse) gives its share, and the shares add up to the full gradients."""
    api = kernels()
    rng = np.random.default_rng(4)
    nb, blk = 4, 16
    bounds = np.arange(nb + 1) * blk
    kept = rng.random((1, nb, nb)) < 0.7
    kept[0, :, 0] = True
    halves = [kept & (np.arange(nb) < 2), kept & (np.arange(nb) >= 2)]
    q64, k64, v64, do64 = inputs(1, 2, 1, nb * blk, nb * blk, 16, seed=5)
    q, k, v, do = (t.to(DEVICE, DTYPE) for t in (q64, k64, v64, do64))
    full = build_plan(BlockLayout(bounds, bounds, kept, blk), DEVICE, SMALL)
    parts = [build_plan(BlockLayout(bounds, bounds, h, blk), DEVICE, SMALL) for h in halves]
    outs = [api.block_sparse_attn_fwd(q, k, v, p) for p in parts]
    lse = torch.logaddexp(outs[0][1], outs[1][1])
    out = sum(o.float() * torch.exp(part_lse - lse)[..., None].nan_to_num(0.0) for o, part_lse in outs).to(DTYPE)
    out_full, lse_full = api.block_sparse_attn_fwd(q, k, v, full)
    torch.testing.assert_close(out, out_full, atol=TOL, rtol=TOL)
    torch.testing.assert_close(lse, lse_full, atol=TOL, rtol=TOL)
    grads = [api.block_sparse_attn_bwd(q, k, v, out, lse, do, p) for p in parts]
    want = api.block_sparse_attn_bwd(q, k, v, out_full, lse_full, do, full)
    for i, name in enumerate(("dq", "dk", "dv")):
        torch.testing.assert_close(grads[0][i] + grads[1][i], want[i], atol=TOL, rtol=TOL, msg=name)


# ---- adapter ----


def _mask(layout: BlockLayout) -> Mask:
    s = int(layout.q_bounds[-1])
    return Mask(name="block_sparse", seqlen_q=s, seqlen_k=s, slices=np.zeros((0, 5), np.int64), blocks=layout)


def test_adapter_declares_capabilities_and_rejects_other_forms():
    from longca.kernels.registry import get

    kern = get("triton_block_sparse")
    assert kern.layout == "bhsd"
    assert kern.caps.mask_forms == frozenset({"block_sparse"})
    assert kern.caps.backward and kern.caps.gqa and kern.caps.package == "triton"
    layout = BlockLayout(np.arange(3) * 64, np.arange(3) * 64, np.ones((2, 2, 2), bool), 64)
    kw = dict(batch=1, heads_q=4, heads_kv=2, head_dim=64, dtype=torch.bfloat16, device="cpu")
    with pytest.raises(ValueError, match="block_sparse form"):
        kern.prepare(_mask(layout), form="dense", **kw)
    with pytest.raises(ValueError, match="KV heads"):
        kern.prepare(_mask(layout), form="block_sparse", **{**kw, "heads_kv": 1, "heads_q": 4})


@needs_triton
def test_adapter_call_matches_reference():
    from longca.kernels.registry import get

    kernels()
    rng = np.random.default_rng(6)
    kept = rng.random((1, 2, 2)) < 0.5
    kept[0, :, 1] = True
    layout = BlockLayout(np.arange(3) * 32, np.arange(3) * 32, kept, 32)
    prep = get("triton_block_sparse").prepare(
        _mask(layout),
        batch=1,
        heads_q=2,
        heads_kv=1,
        head_dim=16,
        dtype=DTYPE,
        device=DEVICE,
        form="block_sparse",
        config=SMALL,
    )
    assert prep.layout == "bhsd" and prep.build_s >= 0 and prep.info["fast_path"]
    # the row's backend names the tiles that ran (shrunk to divide the 32-blocks)
    assert prep.info["backend"] == f"triton tiles {build_plan(layout, 'cpu', SMALL).config.as_text()}"
    q64, k64, v64, _ = inputs(1, 2, 1, 64, 64, 16, seed=7)
    out = prep.call(*(t.to(DEVICE, DTYPE) for t in (q64, k64, v64)))
    torch.testing.assert_close(out.double().cpu(), reference(q64, k64, v64, layout)[0], atol=TOL, rtol=TOL)


@needs_triton
@pytest.mark.parametrize("block", [128, 64])
def test_default_head_dim_128_config_per_block(block):
    # The shipped D=128 tiles for uniform blocks (the H200 sweep's shapes): forward and gradients.
    from longca.kernels.triton_sparse.configs import default_config

    cfg = default_config(128, block)
    plan, _ = run_and_compare(_two_blocks(block), cfg, hq=2, hkv=1, d=128)
    assert plan.fast_path and plan.config == cfg  # the tuned tiles divide the block: nothing shrunk


def _forward_vs_reference(layout: BlockLayout, config: KernelConfig, hq: int, hkv: int, d: int, bshd: bool):
    """Forward out and LSE against the float64 reference; returns uses_tma for these inputs."""
    api = kernels()
    from longca.kernels.triton_sparse.forward import uses_tma

    s = int(layout.q_bounds[-1])
    q64, k64, v64, _ = inputs(1, hq, hkv, s, s, d, seed=8)
    if bshd:  # a transposed (B, S, H, D) tensor: strides not those of a contiguous bhsd one
        q, k, v = (t.transpose(1, 2).contiguous().to(DEVICE, DTYPE).transpose(1, 2) for t in (q64, k64, v64))
    else:
        q, k, v = (t.to(DEVICE, DTYPE) for t in (q64, k64, v64))
    plan = build_plan(layout, DEVICE, config)
    out, lse = api.block_sparse_attn_fwd(q, k, v, plan)
    ref_out, ref_lse = reference(q64, k64, v64, layout)
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=TOL, rtol=TOL)
    lse = lse.double().cpu()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=TOL, rtol=TOL)
    return uses_tma(plan, q, k, v)


@needs_triton
@pytest.mark.parametrize("fwd_kernel", ["tma", "tma_ws"])
@pytest.mark.parametrize("block", [64, 128])
@pytest.mark.parametrize("heads", [(4, 2), (2, 2)], ids=["gqa", "mha"])
def test_tma_forward_uniform_blocks(fwd_kernel, block, heads):
    # The tensor-descriptor forward on uniform blocks, bhsd and transposed bshd inputs; an empty
    # query block checks the 0 output / -inf LSE rows.
    kept = np.random.default_rng(block).random((heads[1], 2, 2)) < 0.6
    kept[:, :, 0] = True
    kept[0, 0, :] = False
    layout = BlockLayout(np.arange(3) * block, np.arange(3) * block, kept, block)
    cfg = KernelConfig(TileConfig(64, 32), fwd_kernel=fwd_kernel)
    for bshd in (False, True):
        assert _forward_vs_reference(layout, cfg, *heads, d=32, bshd=bshd)


@needs_triton
def test_tma_ws_forward_at_the_measured_head_dim_128_tiles():
    # The warp-specialized tiles measured on the H200 (benchmarks/sparse_triton.py --variants).
    cfg = KernelConfig(TileConfig(128, 128, 4, 2), fwd_kernel="tma_ws")
    assert _forward_vs_reference(_two_blocks(128), cfg, 2, 1, d=128, bshd=True)


@needs_triton
def test_tma_forward_falls_back_to_pointer_kernel():
    # Variable blocks (ragged tiles) and 16-byte misaligned rows run the pointer kernel.
    qb = kb = np.array([0, 20, 64, 96])
    kept = np.ones((1, 3, 3), bool)
    cfg = KernelConfig(TileConfig(32, 16), fwd_kernel="tma")
    assert not _forward_vs_reference(BlockLayout(qb, kb, kept, None), cfg, 2, 1, d=16, bshd=False)
    from longca.kernels.triton_sparse.forward import uses_tma

    plan = build_plan(_two_blocks(64), DEVICE, cfg)
    x = torch.zeros(1, 1, 128, 18, device=DEVICE, dtype=DTYPE)[..., :16]  # rows of 18 elements
    assert not uses_tma(plan, x, x, x) and uses_tma(plan, *[x.contiguous()] * 3)


def test_default_config_picks_tiles_by_block():
    from longca.kernels.triton_sparse.configs import default_config

    assert default_config(128, 128).fwd == TileConfig(128, 128, 4, 2)
    assert default_config(128, 128).fwd_kernel == "tma_ws"
    assert default_config(128, 64).fwd_kernel == default_config(128).fwd_kernel == "ptr"
    assert default_config(128, 256) == default_config(128, 128)
    assert default_config(128, 64).fwd == TileConfig(64, 64, 4, 3)
    assert default_config(128, 192) == default_config(128, 64)
    assert default_config(128, None) == default_config(128, 48) == default_config(128)
    with pytest.raises(ValueError, match="head_dim=96"):
        default_config(96, 128)


@needs_triton
@pytest.mark.parametrize("block", [64, 128])
def test_fp8_forward_matches_the_reference_on_its_rounded_inputs(block):
    """e4m3 q, k, v in, e4m3 out: on a GPU within the fp8 tolerance (8%) of the reference on the same
    rounded inputs, and far from the layout ignored. Triton's CPU interpreter does not round to e4m3
    to nearest as the GPU does (on uniform values in [0.05, 0.95] its conversion is 0.9% low on
    average, torch's 0.16%), so there its bound is 15%; the layout-ignored bound checks the logic."""
    api = kernels()
    f8 = torch.float8_e4m3fn
    bounds = np.arange(3) * block
    layout = BlockLayout(bounds, bounds, np.array([[[True, False], [True, True]]]), block)  # block-causal
    q64, k64, v64, _ = inputs(1, 2, 1, 2 * block, 2 * block, 64, seed=3)
    q, k, v = (t.to(f8) for t in (q64, k64, v64))
    plan = build_plan(layout, DEVICE, KernelConfig(TileConfig(64, 64), TileConfig(32, 64), TileConfig(64, 32)))
    out, _ = api.block_sparse_attn_fwd(*(t.to(DEVICE) for t in (q, k, v)), plan)
    assert out.dtype == f8
    rounded = [t.double() for t in (q, k, v)]
    err = lambda ref: float(torch.linalg.vector_norm(out.double().cpu() - ref) / torch.linalg.vector_norm(ref))  # noqa: E731
    assert err(reference(*rounded, layout)[0]) < (8e-2 if ON_GPU else 0.15)
    everything = BlockLayout(layout.q_bounds, layout.k_bounds, np.ones_like(layout.kept), block)
    assert err(reference(*rounded, everything)[0]) > 0.3


def test_fp8_is_forward_only_in_the_adapter():
    from longca.kernels.base import static_unsupported_reason
    from longca.kernels.registry import get
    from longca.masks.forms import forms_of

    caps = get("triton_block_sparse").caps
    kw = dict(
        mask_name="block_sparse",
        mask_forms=forms_of("block_sparse"),
        dtype="float8_e4m3fn",
        head_dim=128,
        heads_q=8,
        heads_kv=1,
        device="cuda",
        block_size=128,
    )
    assert static_unsupported_reason(caps, pass_="fwd", **kw) is None
    assert static_unsupported_reason(caps, pass_="bwd", **kw).startswith("no backward in float8_e4m3fn")


def test_fp8_takes_the_pointer_forward_where_the_tuned_config_is_a_tma_one():
    """The tuned block-128 config runs the TMA forward, which Triton 3.6 cannot compile for e4m3 on
    the H200 (call 64); fp8 cells get the pointer kernel with the same tiles, and the row says so."""
    from longca.kernels.registry import get
    from longca.kernels.triton_sparse.configs import default_config

    layout = BlockLayout(np.arange(3) * 128, np.arange(3) * 128, np.ones((1, 2, 2), bool), 128)
    assert default_config(128, 128).fwd_kernel == "tma_ws"
    kw = dict(batch=1, heads_q=2, heads_kv=1, head_dim=128, device="cpu", form="block_sparse")
    fp8 = get("triton_block_sparse").prepare(_mask(layout), dtype=torch.float8_e4m3fn, **kw).info["backend"]
    bf16 = get("triton_block_sparse").prepare(_mask(layout), dtype=torch.bfloat16, **kw).info["backend"]
    assert bf16.endswith(";fwd_kernel=tma_ws") and "fwd_kernel" not in fp8
    assert fp8 == bf16.removesuffix(";fwd_kernel=tma_ws")

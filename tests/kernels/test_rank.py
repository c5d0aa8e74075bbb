import pytest
import torch

from longca.cp.reference import reference_attention
from longca.kernels.adapters.flex import RankFlex as Flex
from longca.kernels.adapters.naive import RankNaive as Naive
from longca.kernels.adapters.sdpa import rectangles
from longca.kernels.base import Unsupported, rank_unsupported_reason
from longca.kernels.lse import Part
from longca.kernels.rank import RankKernel, bwd_by_autograd
from longca.kernels.registry import get, rank_kernel, rank_kernel_names
from longca.masks import slices as sl
from longca.masks.registry import build_mask
from longca.measure.reference import relative_error

CPU = torch.device("cpu")


def _inputs(s=24, hq=4, hk=2, d=8):
    g = torch.Generator().manual_seed(5)
    q, do = (torch.randn(1, hq, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, hk, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, do


def _partial_mask(s=24):
    # Rows 0-3 see nothing (as in many ring steps), a window elsewhere.
    return sl.concat([sl.band_slices(4, s, 0, s, -3, 2)])


def test_naive_forward_and_backward_match_the_autograd_reference():
    q, k, v, do = _inputs()
    slices = _partial_mask()
    nv = Naive()
    sub = nv.prepare(slices, 24, 24, CPU)
    out, lse = nv.fwd(q, k, v, sub)
    ref = reference_attention(q, k, v, slices, do)
    assert relative_error(out, ref[0]) < 1e-13
    assert torch.isinf(lse[..., :4]).all() and (out[..., :4, :] == 0).all() and not out.isnan().any()
    for got, want in zip(nv.bwd(do, q, k, v, out, lse, sub), ref[1:]):
        assert relative_error(got, want) < 1e-13


def test_step_gradients_with_the_global_lse_add_up_to_the_full_gradient():
    """Two key halves computed separately, each backward given the combined out/LSE, sum to the
    gradient of attention over all keys (explicit formulas and the autograd identity alike)."""
    q, k, v, do = _inputs()
    mask = build_mask("causal", 24).slices
    ref = reference_attention(q, k, v, mask, do)
    nv = Naive()
    halves = [(0, 12), (12, 24)]
    subs = [nv.prepare(sl.shift_slices(sl.clip_slices(mask, 0, 24, a, b), 0, -a), 24, b - a, CPU) for a, b in halves]
    from longca.kernels.lse import combine

    parts = [nv.fwd(q, k[:, :, a:b], v[:, :, a:b], sb) for (a, b), sb in zip(halves, subs)]
    out, lse = combine(parts)
    assert relative_error(out, ref[0]) < 1e-13
    for method in ("explicit", "autograd"):
        dq = torch.zeros_like(q)
        dks, dvs = [], []
        for (a, b), sb in zip(halves, subs):
            kk, vv = k[:, :, a:b], v[:, :, a:b]
            if method == "explicit":
                g = nv.bwd(do, q, kk, vv, out, lse, sb)
            else:
                g = bwd_by_autograd(lambda x, y, z: nv.fwd(x, y, z, sb), do, q, kk, vv, out, lse)
            dq += g[0]
            dks.append(g[1])
            dvs.append(g[2])
        assert relative_error(dq, ref[1]) < 1e-13
        assert relative_error(torch.cat(dks, 2), ref[2]) < 1e-13
        assert relative_error(torch.cat(dvs, 2), ref[3]) < 1e-13


def test_flex_forward_and_backward_match_reference_on_cpu():
    # The backward is Flex's own backward operator on (out, lse) (longca.kernels.flex_backward), eager here.
    q, k, v, do = _inputs(s=32)
    slices = _partial_mask(32)
    fx = Flex()
    sub = fx.prepare(slices, 32, 32, CPU)
    out, lse = fx.fwd(q, k, v, sub)
    ref = reference_attention(q, k, v, slices, do)
    assert relative_error(out, ref[0]) < 1e-12
    grads = fx.bwd(do, q, k, v, out, lse, sub)
    assert all(g.dtype == torch.float64 and not g.isnan().any() for g in grads)
    for got, want in zip(grads, ref[1:]):
        assert relative_error(got, want) < 1e-12


def test_rectangles_cut_causal_into_square_pieces_and_reject_bands():
    rect = rectangles(sl.make_slices([(0, 4, 0, 10, sl.Kind.CAUSAL), (4, 10, 0, 3, sl.Kind.CAUSAL)]))
    assert rect == [(0, 4, 0, 6, False), (0, 4, 6, 10, True), (7, 10, 0, 3, True)]
    with pytest.raises(Unsupported, match="BICAUSAL.*flex"):
        rectangles(sl.band_slices(0, 8, 0, 8, -2, 2))


def test_capabilities_and_names_are_checked_with_clear_messages():
    """Per-rank kernels come from the one kernel registry: its capabilities say which can serve."""
    caps = get("sdpa_cudnn").caps
    assert rank_unsupported_reason(caps, device="cpu", dtype="bfloat16", block_sparse=False) == (
        "as a CP per-rank kernel it runs on ['cuda'], not cpu"
    )
    assert "takes slice masks only" in rank_unsupported_reason(caps, device="cuda", dtype="bfloat16", block_sparse=True)
    assert "block-sparse masks only" in rank_unsupported_reason(
        get("triton_block_sparse").caps, device="cuda", dtype="bfloat16", block_sparse=False
    )
    assert rank_unsupported_reason(get("naive").caps, device="cpu", dtype="float64", block_sparse=True) is None
    assert rank_kernel_names() == ["flex", "naive", "sdpa_cudnn", "sdpa_flash", "triton_block_sparse"]
    with pytest.raises(Unsupported, match="'fa4' cannot be a context-parallel per-rank kernel.*allowed: \\['flex'"):
        rank_kernel("fa4")
    with pytest.raises(KeyError, match="unknown kernel 'fa9'; allowed"):
        rank_kernel("fa9")
    assert isinstance(rank_kernel("naive"), Naive) and rank_kernel("naive") is not rank_kernel("naive")


def test_every_rank_kernel_declares_its_optional_parts_once():
    """Every per-rank kernel is a RankKernel: planning reads the adapter's RankCapabilities.block_sparse
    and the ranks the kernel's `takes_blocks`, one value; kernels without their own `fwd_parts`,
    `native_gqa` or `backend_detail` get the defaults (naive: `fwd` as one part, no GQA choice)."""
    for name in rank_kernel_names():
        kernel = rank_kernel(name)
        assert isinstance(kernel, RankKernel), name
        assert kernel.takes_blocks is get(name).caps.cp.block_sparse, name
    naive = rank_kernel("naive")
    q, k, v, _ = _inputs()
    sub = naive.prepare(_partial_mask(), 24, 24, CPU)
    (part,) = naive.fwd_parts(q, k, v, sub)
    out, lse = naive.fwd(q, k, v, sub)
    assert isinstance(part, Part) and (part.q0, part.q1) == (0, 24)
    assert torch.equal(part.out, out) and torch.equal(part.lse, lse)
    assert naive.native_gqa(q) is None and naive.backend_detail() is None
    naive.prepare_check(sl.band_slices(0, 24, 0, 24, -2, 2))  # takes every slice kind


def test_flex_on_cuda_shares_the_adapter_compiled_flex_with_raised_recompile_limits():
    # Building the compiled wrapper touches no GPU. Every ring step and check length recompiles;
    # dynamo's default limit (8) would drop to eager flex, which materialises S x S scores.
    import torch._dynamo

    from longca.kernels.adapters.flex import compiled_flex
    from longca.kernels.dynamo_limits import RECOMPILE_LIMIT

    fn = Flex()._flex(torch.device("cuda"))
    assert fn is compiled_flex()
    assert torch._dynamo.config.recompile_limit >= RECOMPILE_LIMIT
    assert Flex()._flex(torch.device("cpu")) is not fn  # CPU runs eager flex (no CPU backward anyway)


# ------------------------------------------------------- sdpa: rectangles, parts, GQA on the CPU
import math  # noqa: E402

from longca.kernels.adapters.sdpa import RankSdpa as Sdpa  # noqa: E402


class _SdpaOnCpuMath(Sdpa):
    """Sdpa's own logic (rectangles, one part per rectangle, GQA with or without repeated K/V,
    gradient sums) on the CPU: only the two CUDA aten ops are replaced, by the same math. On the
    GPU every CP cell checks the real ops against the float32 reference."""

    def __init__(self, takes_gqa: bool):
        super().__init__("cudnn")
        self.takes_gqa = takes_gqa
        self.kv_heads_seen: set[int] = set()

    def _scores(self, q, k, v, causal):
        if k.shape[1] != q.shape[1]:
            if not self.takes_gqa:
                raise RuntimeError("this op wants as many K/V heads as Q heads")
            g = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if causal:  # top-left aligned: the rectangles' causal pieces are square
            s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
        return s, v

    def _fwd_op(self, q, k, v, causal):
        self.kv_heads_seen.add(k.shape[1])
        s, vv = self._scores(q, k, v, causal)
        lse = torch.logsumexp(s, -1)
        return (torch.softmax(s, -1) @ vv, lse, None, None, q.shape[2], k.shape[2], None, None, None)

    def _bwd_op(self, do, q, k, v, o, lse, causal):
        # as the real ops: P from the GLOBAL lse, D = rowsum(dO * O) from the GLOBAL output
        b, hk, sk, d = k.shape
        g = q.shape[1] // hk
        s, vv = self._scores(q, k, v, causal)
        kk = k.repeat_interleave(g, dim=1)
        p = torch.exp(s - lse.reshape(s.shape[:3]).unsqueeze(-1))
        ds = p * (do @ vv.transpose(-1, -2) - (do * o).sum(-1, keepdim=True)) / math.sqrt(d)
        dq, dk, dv = ds @ kk, ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ do
        if g > 1:  # only reached with K/V of their own heads when the op takes GQA
            dk, dv = dk.view(b, hk, g, sk, d).sum(2), dv.view(b, hk, g, sk, -1).sum(2)
        return dq, dk, dv


@pytest.mark.parametrize("takes_gqa", [True, False])
def test_sdpa_parts_and_gqa_match_naive_on_the_same_sub_mask(takes_gqa):
    q, k, v, do = (t.float() for t in _inputs(s=16))
    # a causal slice wider than tall (a full block beside a square triangle), a full block on
    # other rows, and rows 12-16 with no key: three rectangles, two of them on rows 0-8
    slices = sl.make_slices([(0, 8, 0, 12, sl.Kind.CAUSAL), (8, 12, 2, 6, sl.Kind.FULL)])
    kernel, nv = _SdpaOnCpuMath(takes_gqa), Naive()
    assert kernel.native_gqa(q) is takes_gqa
    kernel.kv_heads_seen.clear()
    sub, nsub = kernel.prepare(slices, 16, 16, CPU), nv.prepare(slices, 16, 16, CPU)
    assert len(sub.form) == 3
    parts = kernel.fwd_parts(q, k, v, sub)
    assert [(p.q0, p.q1) for p in parts] == [(0, 8), (0, 8), (8, 12)]
    out, lse = kernel.fwd(q, k, v, sub)
    ref_out, ref_lse = nv.fwd(q, k, v, nsub)
    assert relative_error(out, ref_out) < 1e-5
    assert torch.allclose(lse[..., :12], ref_lse[..., :12], atol=1e-5) and torch.isinf(lse[..., 12:]).all()
    grads = kernel.bwd(do, q, k, v, ref_out, ref_lse, sub)
    for got, want in zip(grads, nv.bwd(do, q, k, v, ref_out, ref_lse, nsub)):
        assert got.shape == want.shape and relative_error(got, want) < 1e-5
    # K/V reach the ops with their own 2 heads only when the ops take GQA
    assert kernel.kv_heads_seen == ({2} if takes_gqa else {4})


def test_sdpa_native_gqa_check_refuses_an_op_that_computes_gqa_wrongly():
    class _WrongGrouping(_SdpaOnCpuMath):
        def _scores(self, q, k, v, causal):  # heads grouped blockwise instead of interleaved
            if k.shape[1] != q.shape[1]:
                g = q.shape[1] // k.shape[1]
                k, v = k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1)
            return super()._scores(q, k, v, causal)

    q = torch.zeros(1, 4, 8, 8)
    assert _WrongGrouping(takes_gqa=True).native_gqa(q) is False

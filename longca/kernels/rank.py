"""The per-rank attention of one (rank, ring step): a kernel over local q, k, v and a sub-mask.

Every local kernel offers
    prepare(slices, seqlen_q, seqlen_k, device) -> SubMask     (outside the timed region)
    fwd(q, k, v, sub) -> (out, lse)
    bwd(dout, q, k, v, out, lse, sub) -> (dq, dk, dv)
with q (B, Hq, Sq, D), k and v (B, Hkv, Sk, D) (Hq a multiple of Hkv), out float32 (float64 for
float64 inputs) and lse of shape (B, Hq, Sq) in natural log, -inf on rows with no key. `fwd`
returns new tensors that the caller owns. A kernel may also offer
    fwd_parts(q, k, v, sub) -> [longca.kernels.lse.Part(out, lse, q0, q1), ...]
its result as row ranges with out in the kernel's own dtype (sdpa: one part per rectangle), which
the ring combines once at the end instead of widening and merging every step in float32.
In `bwd`, `out` and `lse` are the GLOBAL (combined) output and LSE: with them every step's
gradient is exactly its additive share (P = exp(S scale - lse) is the global softmax restricted
to this step's keys; D = rowsum(dO * O) is global), as in ring-flash-attention.

Kernels: naive (dense mask, explicit formulas, any device and dtype, small S), flex
(BlockMask from longca.masks.flex; backward: Flex's own backward kernel on the combined out/LSE,
longca.kernels.flex_backward), sdpa_flash and
sdpa_cudnn (CUDA; the sub-mask is cut into FULL and square CAUSAL rectangles, one call each),
triton_block_sparse (block-sparse masks only: longca's Triton kernel over the step's block lists).

Block-sparse masks (different kept blocks per KV head) have no slices; kernels that take them
(`takes_blocks`) also offer
    prepare_blocks(layout, heads_q, device) -> SubMask
with `layout` the step's local BlockLayout (longca.cp.submask.sub_layout) over exactly the KV
heads the kernel will see (k.shape[1]); heads_q is the local query head count.

Every kernel derives from RankKernel, whose optional parts say what a kernel without them does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from longca.kernels.base import Unsupported
from longca.kernels.lse import Part, combine_parts
from longca.masks import slices as sl
from longca.masks.blocks import BlockLayout

NO_SLICES = np.zeros((0, 5), dtype=np.int64)


@dataclass
class SubMask:
    slices: np.ndarray
    seqlen_q: int
    seqlen_k: int
    area: int  # attended pairs (summed over the layout's KV heads for a block-sparse step)
    form: Any = None  # kernel-specific: dense tensor, BlockMask, rectangle list, sparse plan
    blocks: BlockLayout | None = None  # the step's local block layout (block-sparse masks)

    @property
    def empty(self) -> bool:
        return self.area == 0


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _layout_area(layout: BlockLayout) -> int:
    return int(layout.area_per_head().sum())


def _check_heads(sub: SubMask, k: torch.Tensor) -> None:
    if sub.blocks is not None and sub.blocks.heads != k.shape[1]:
        raise ValueError(f"the step's block layout has {sub.blocks.heads} KV heads, the local k has {k.shape[1]}")


def _gqa(q: torch.Tensor, k: torch.Tensor) -> int:
    hq, hk = q.shape[1], k.shape[1]
    if hq % hk:
        raise Unsupported(f"heads_q={hq} is not a multiple of heads_kv={hk}")
    return hq // hk


class RankKernel:
    """The per-rank kernel interface: subclasses define `name`, `prepare`, `fwd` and `bwd` (module
    docstring); the rest defaults to what a kernel without it does."""

    name: str
    # Whether it takes block-sparse masks (`prepare_blocks`): the adapter's RankCapabilities.block_sparse
    # is this value, so planning and the ranks read one declaration.
    takes_blocks: bool = False

    def prepare(self, slices: np.ndarray, seqlen_q: int, seqlen_k: int, device: torch.device) -> SubMask:
        raise NotImplementedError

    def fwd(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sub: SubMask):
        raise NotImplementedError

    def bwd(self, dout, q, k, v, out, lse, sub: SubMask):
        raise NotImplementedError

    def prepare_check(self, slices: np.ndarray) -> None:
        """Raise Unsupported when a step of `slices` is one this kernel cannot take: called for every
        step of a plan before any step is prepared. Takes every slice kind by default."""

    def prepare_blocks(self, layout: BlockLayout, heads_q: int, device: torch.device) -> SubMask:
        """The step's block layout prepared (kernels with `takes_blocks` only)."""
        raise Unsupported(f"per-rank kernel {self.name!r} takes slice masks only, not block-sparse masks")

    def fwd_parts(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sub: SubMask) -> list[Part]:
        """The step's result as row ranges to combine later; by default `fwd`'s full rows as one part."""
        out, lse = self.fwd(q, k, v, sub)
        return [Part(out, lse, 0, q.shape[2])]

    def native_gqa(self, q: torch.Tensor) -> bool | None:
        """Whether K/V reach the kernel's ops with their own head count where it could also repeat
        them to Hq (recorded by benchmarks/cp_rank_local.py); None: the kernel has no such choice."""
        return None

    def backend_detail(self) -> str | None:
        """What a row's `backend` names beyond the kernel (its configuration in the timed run), or None."""
        return None


# ---------------------------------------------------------------------------------------- naive
class Naive(RankKernel):
    """Dense scores and an explicit backward. Memory O(B Hq Sq Sk): references and small S only."""

    name = "naive"
    takes_blocks = True

    def prepare(self, slices: np.ndarray, seqlen_q: int, seqlen_k: int, device: torch.device) -> SubMask:
        dense = sl.to_dense_tensor(slices, seqlen_q, seqlen_k, device)
        return SubMask(slices, seqlen_q, seqlen_k, sl.area(slices), dense)

    def prepare_blocks(self, layout: BlockLayout, heads_q: int, device: torch.device) -> SubMask:
        """Dense per-KV-head mask (Hkv, 1, Sq, Sk): broadcasts over the GQA group dimension."""
        from longca.masks.mask import Mask
        from longca.measure.reference import dense_mask_tensor

        sq, sk = int(layout.q_bounds[-1]), int(layout.k_bounds[-1])
        form = dense_mask_tensor(Mask("cp_step", sq, sk, NO_SLICES, blocks=layout), device).unsqueeze(1)
        return SubMask(NO_SLICES, sq, sk, _layout_area(layout), form, layout)

    @staticmethod
    def _scores(q, k, sub):
        g = _gqa(q, k)
        b, hq, sq, d = q.shape
        a = acc_dtype(q.dtype)
        qg = q.to(a).view(b, hq // g, g, sq, d)
        s = qg @ k.to(a).unsqueeze(2).transpose(-1, -2) / math.sqrt(d)
        return s, g  # (B, Hkv, G, Sq, Sk)

    def fwd(self, q, k, v, sub):
        _check_heads(sub, k)
        b, hq, sq, d = q.shape
        s, g = self._scores(q, k, sub)
        s = s.masked_fill(~sub.form, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.where(sub.form & torch.isfinite(lse).unsqueeze(-1), torch.exp(s - lse.unsqueeze(-1)), 0.0)
        out = p @ v.to(s.dtype).unsqueeze(2)
        return out.reshape(b, hq, sq, -1), lse.reshape(b, hq, sq)

    def bwd(self, dout, q, k, v, out, lse, sub):
        _check_heads(sub, k)
        b, hq, sq, d = q.shape
        hk = k.shape[1]
        s, g = self._scores(q, k, sub)
        a = s.dtype
        lse5 = lse.to(a).view(b, hk, g, sq, 1)
        p = torch.where(sub.form & torch.isfinite(lse5), torch.exp(s - lse5), 0.0)
        do = dout.to(a).view(b, hk, g, sq, -1)
        o = out.to(a).view(b, hk, g, sq, -1)
        dv = (p.transpose(-1, -2) @ do).sum(2)
        dp = do @ v.to(a).unsqueeze(2).transpose(-1, -2)
        delta = (do * o).sum(-1, keepdim=True)
        ds = p * (dp - delta) / math.sqrt(d)
        dq = (ds @ k.to(a).unsqueeze(2)).reshape(b, hq, sq, d)
        dk = (ds.transpose(-1, -2) @ q.to(a).view(b, hk, g, sq, d)).sum(2)
        return dq, dk, dv


# ----------------------------------------------------------------------------------------- flex
def bwd_by_autograd(fwd: Callable, dout, q, k, v, out, lse):
    """Gradients of one step's share of the combined output, given a differentiable local forward
    fwd(q, k, v) -> (out_i, lse_i). With w_i = exp(lse_i - L) the combined O = sum_i w_i out_i, so
    dL/dout_i = w_i dO and dL/dlse_i = w_i rowsum(dO * (out_i - O))."""
    with torch.enable_grad():
        qi, ki, vi = (t.detach().requires_grad_(True) for t in (q, k, v))
        o_i, l_i = fwd(qi, ki, vi)
        a = acc_dtype(q.dtype)
        L = lse.to(a)
        w = torch.where(torch.isfinite(l_i) & torch.isfinite(L), torch.exp(l_i.to(a) - L), 0.0)
        g_out = (w.unsqueeze(-1) * dout.to(a)).to(o_i.dtype)
        g_lse = (w * (dout.to(a) * (o_i.to(a) - out.to(a))).sum(-1)).to(l_i.dtype)
        dq, dk, dv = torch.autograd.grad((o_i, l_i), (qi, ki, vi), (g_out, g_lse))
    return dq.to(a), dk.to(a), dv.to(a)


class Flex(RankKernel):
    """FlexAttention with a BlockMask built from the sub-mask's slices (compiled on CUDA).
    Rows of a step with no key get lse = -inf and zero output from FlexAttention itself."""

    name = "flex"
    takes_blocks = True

    def __init__(self) -> None:
        self._fn = None

    def _flex(self, device: torch.device):
        # On CUDA the single-device adapter's compiled flex_attention, whose raised recompile limits
        # matter here: every ring step's BlockMask and the check length recompile, and past dynamo's
        # default limit (8) it falls back to eager flex, which materialises S x S scores (the H200's
        # CP backward asked for 256 GiB that way).
        if self._fn is None:
            if device.type == "cuda":
                from longca.kernels.adapters.flex import compiled_flex

                self._fn = compiled_flex()
            else:
                from torch.nn.attention.flex_attention import flex_attention

                self._fn = flex_attention
        return self._fn

    def prepare(self, slices, seqlen_q, seqlen_k, device):
        # The masks package builds the BlockMask block by block from the slices (never S x S).
        from longca.masks.flex import to_block_mask
        from longca.masks.mask import Mask

        area = sl.area(slices)
        bm = None
        if area:
            bm = to_block_mask(Mask("cp_step", seqlen_q, seqlen_k, slices), device=device)
        return SubMask(slices, seqlen_q, seqlen_k, area, bm)

    def prepare_blocks(self, layout: BlockLayout, heads_q: int, device: torch.device) -> SubMask:
        """BlockMask of the step's block layout, one entry per local query head (FlexAttention
        indexes a BlockMask by query head; GQA maps query head h to KV head h // group)."""
        from longca.masks.flex import to_block_mask
        from longca.masks.mask import Mask

        sq, sk = int(layout.q_bounds[-1]), int(layout.k_bounds[-1])
        area = _layout_area(layout)
        bm = None
        if area:
            bm = to_block_mask(Mask("cp_step", sq, sk, NO_SLICES, blocks=layout), device=device, heads_q=heads_q)
        return SubMask(NO_SLICES, sq, sk, area, bm, layout)

    def _call(self, q, k, v, sub):
        from torch.nn.attention.flex_attention import AuxRequest

        out, aux = self._flex(q.device)(
            q,
            k,
            v,
            block_mask=sub.form,
            scale=1.0 / math.sqrt(q.shape[-1]),
            enable_gqa=q.shape[1] != k.shape[1],
            return_aux=AuxRequest(lse=True),
        )
        return out, aux.lse

    def fwd_parts(self, q, k, v, sub) -> list:
        """All rows as one part, out in the inputs' dtype (no float32 copy before the combination)."""
        _check_heads(sub, k)
        # Never differentiated through (the ring's backward is hand-written); detached inputs also
        # keep torch from refusing CPU inputs that require grad.
        out, lse = self._call(q.detach(), k.detach(), v.detach(), sub)
        return [Part(out, lse.to(acc_dtype(q.dtype)), 0, q.shape[2])]

    def fwd(self, q, k, v, sub):
        ((out, lse, _, _),) = self.fwd_parts(q, k, v, sub)
        return out.to(acc_dtype(q.dtype)), lse

    def bwd(self, dout, q, k, v, out, lse, sub):
        """Flex's backward kernel given the combined (out, lse): no forward runs again
        (longca.kernels.flex_backward). The earlier path, `bwd_by_autograd` over `_call`, runs the
        step's forward again; benchmarks/cp_rank_local.py --also-autograd times it beside this one."""
        from longca.kernels.flex_backward import flex_backward

        _check_heads(sub, k)
        a = acc_dtype(q.dtype)
        dq, dk, dv = flex_backward(dout, q, k, v, out, lse, sub.form, 1.0 / math.sqrt(q.shape[-1]))
        return dq.to(a), dk.to(a), dv.to(a)


# ----------------------------------------------------------------------------------------- sdpa
def rectangles(slices: np.ndarray) -> list[tuple[int, int, int, int, bool]]:
    """Cut FULL / CAUSAL slices into (q0, q1, k0, k1, causal) rectangles whose causal ones are
    square (what SDPA's is_causal means when Sq == Sk). INVCAUSAL / BICAUSAL raise Unsupported."""
    out = []
    for q0, q1, k0, k1, kind in np.asarray(slices).reshape(-1, 5).tolist():
        m, n = q1 - q0, k1 - k0
        if kind == sl.Kind.FULL:
            out.append((q0, q1, k0, k1, False))
        elif kind == sl.Kind.CAUSAL:
            if n >= m:  # bottom-right aligned: a full block left of a square triangle
                if n > m:
                    out.append((q0, q1, k0, k1 - m, False))
                out.append((q0, q1, k1 - m, k1, True))
            else:  # the first m - n rows see nothing
                out.append((q1 - n, q1, k0, k1, True))
        else:
            raise Unsupported(
                f"sdpa local kernels take FULL and CAUSAL rectangles; this sub-mask has a "
                f"{sl.Kind(kind).name} slice (use the per-rank kernel 'flex')"
            )
    return out


class Sdpa(RankKernel):
    """torch's fused SDPA ops that take and return the log-sum-exp (flash = FA2 inside torch, or
    cuDNN). GQA: K/V go to the ops with their own head count where the op computes GQA itself
    (checked once per device, dtype and head dim against the ops on repeated K/V), else KV heads
    are repeated to Hq for the call and their gradients summed back."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.name = f"sdpa_{backend}"
        self._tmpl: dict[Any, Any] = {}
        self._native: dict[Any, bool] = {}

    def prepare_check(self, slices: np.ndarray) -> None:
        rectangles(slices)

    def prepare(self, slices, seqlen_q, seqlen_k, device):
        return SubMask(slices, seqlen_q, seqlen_k, sl.area(slices), rectangles(slices))

    def _fwd_op(self, q, k, v, causal):
        scale = 1.0 / math.sqrt(q.shape[-1])
        if self.backend == "flash":
            r = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        else:
            r = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)
        return r

    def _bwd_op(self, do, q, k, v, o, lse, causal):
        """(dq, dk, dv) of one rectangle; lse (B, H, Sq) float32, every tensor contiguous."""
        tmpl = self._template(q)
        if len(tmpl[1].shape) == 4:  # (B, H, S) or (B, H, S, 1) by backend
            lse = lse.unsqueeze(-1)
        sq, sk, scale = q.shape[2], k.shape[2], 1.0 / math.sqrt(q.shape[-1])
        if self.backend == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention_backward(
                do, q, k, v, o, lse, tmpl[2], tmpl[3], sq, sk, 0.0, causal, tmpl[6], tmpl[7], scale=scale
            )
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, o, lse, tmpl[6], tmpl[7], None, tmpl[2], tmpl[3], sq, sk, 0.0, causal, scale=scale
        )

    def _template(self, q):
        """Auxiliary arguments of the backward ops (rng state, undefined varlen offsets), taken once
        from a tiny forward: with dropout 0 they carry no data."""
        key = (q.device, q.dtype, q.shape[-1])
        if key not in self._tmpl:
            t = torch.zeros(1, 1, 128, q.shape[-1], device=q.device, dtype=q.dtype)
            self._tmpl[key] = self._fwd_op(t, t, t, False)
        return self._tmpl[key]

    def native_gqa(self, q: torch.Tensor) -> bool:
        """Whether the ops take K/V with fewer heads than Q and compute GQA themselves, as
        F.scaled_dot_product_attention(enable_gqa=True) relies on: checked once per (device, dtype,
        head dim) on a small problem against the same ops on repeated K/V, forward and backward,
        causal and not. Repeating K/V to Hq costs a (B, Hq, S, D) copy of each per step at 64:8."""
        key = (q.device, q.dtype, q.shape[-1])
        if key not in self._native:
            self._native[key] = self._check_native_gqa(q.device, q.dtype, q.shape[-1])
        return self._native[key]

    def _check_native_gqa(self, device, dtype, d) -> bool:
        def rel(x, y):
            return float((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30))

        gen = torch.Generator(device=device).manual_seed(0)
        q, do = (torch.randn(1, 4, 256, d, generator=gen, device=device, dtype=dtype) for _ in range(2))
        k, v = (torch.randn(1, 2, 256, d, generator=gen, device=device, dtype=dtype) for _ in range(2))
        kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        try:
            for causal in (False, True):
                o, l_ = self._fwd_op(q, k, v, causal)[:2]
                o_r, l_r = self._fwd_op(q, kr, vr, causal)[:2]
                lse, o_r = l_r.reshape(1, 4, 256).float().contiguous(), o_r.contiguous()
                g = self._bwd_op(do, q, k, v, o_r, lse, causal)
                g_r = self._bwd_op(do, q, kr, vr, o_r, lse, causal)
                g_r = (g_r[0], g_r[1].view(1, 2, 2, 256, d).sum(2), g_r[2].view(1, 2, 2, 256, d).sum(2))
                errs = [rel(o, o_r), rel(l_.reshape(1, 4, 256), l_r.reshape(1, 4, 256))]
                errs += [rel(a, b) for a, b in zip(g, g_r)]
                if not all(e < 1e-2 for e in errs) or g[1].shape != k.shape:
                    return False
            return True
        except Exception:  # noqa: BLE001 - an op that refuses GQA: repeat K/V instead
            return False

    def _kv(self, q, k, v, k0, k1):
        """K/V columns [k0, k1) for the ops: as they are (native GQA or MHA), else repeated to Hq."""
        g = _gqa(q, k)
        kk, vv = k[:, :, k0:k1], v[:, :, k0:k1]
        if g > 1 and not self.native_gqa(q):
            kk, vv = kk.repeat_interleave(g, dim=1), vv.repeat_interleave(g, dim=1)
        return kk, vv

    def fwd_parts(self, q, k, v, sub) -> list:
        """One part per rectangle: its rows' output in q's dtype and LSE in float32, combined later
        (longca.kernels.lse.combine_parts) with the other rectangles' and steps' parts."""
        b, hq = q.shape[:2]
        parts = []
        for q0, q1, k0, k1, causal in sub.form:
            r = self._fwd_op(q[:, :, q0:q1], *self._kv(q, k, v, k0, k1), causal)
            parts.append(Part(r[0], r[1].reshape(b, hq, q1 - q0).to(acc_dtype(q.dtype)), q0, q1))
        return parts

    def fwd(self, q, k, v, sub):
        b, hq, sq, _ = q.shape
        a = acc_dtype(q.dtype)
        return combine_parts(self.fwd_parts(q, k, v, sub), (b, hq, sq, v.shape[-1]), a, a, q.device)

    def bwd(self, dout, q, k, v, out, lse, sub):
        g = _gqa(q, k)
        b, hq, sq, d = q.shape
        hk = k.shape[1]
        a = acc_dtype(q.dtype)
        dq = torch.zeros(q.shape, device=q.device, dtype=a)
        dk = torch.zeros(k.shape, device=q.device, dtype=a)
        dv = torch.zeros(v.shape, device=q.device, dtype=a)
        o_in = out.to(q.dtype)
        do_in = dout.to(q.dtype)
        for q0, q1, k0, k1, causal in sub.form:
            kk, vv = self._kv(q, k, v, k0, k1)
            # cuDNN wants dO laid out like O; contiguous pieces satisfy both ops.
            args = tuple(x.contiguous() for x in (do_in[:, :, q0:q1], q[:, :, q0:q1], kk, vv, o_in[:, :, q0:q1]))
            gq, gk, gv = self._bwd_op(*args, lse[:, :, q0:q1].float().contiguous(), causal)
            dq[:, :, q0:q1] += gq
            if gk.shape[1] != hk:  # repeated K/V: sum each group's gradients back to its KV head
                gk = gk.view(b, hk, g, k1 - k0, d).sum(2)
                gv = gv.view(b, hk, g, k1 - k0, -1).sum(2)
            dk[:, :, k0:k1] += gk
            dv[:, :, k0:k1] += gv
        return dq, dk, dv


# ------------------------------------------------------------------------------ triton sparse
class TritonBlockSparse(RankKernel):
    """longca's Triton block-sparse kernel (longca.kernels.triton_sparse) over the step's block
    lists: the forward visits only the kept blocks of the KV shard held and returns the LSE; the
    backward takes the global (out, LSE), which the kernel's backward accepts as given (so each
    step's gradient is its exact share). GQA inside the kernel (no K/V repeat). Index tables are
    built from the step's BlockLayout on first use per head dim (the warm-up call), cached in the
    SubMask. Block-sparse masks only. On CPU only under Triton's interpreter (TRITON_INTERPRET=1)."""

    name = "triton_block_sparse"
    takes_blocks = True

    def prepare_check(self, slices: np.ndarray) -> None:
        raise Unsupported(
            "per-rank kernel 'triton_block_sparse' takes block-sparse masks (block_sparse, "
            "variable_block_sparse), not slice masks (use flex or sdpa_cudnn)"
        )

    def prepare(self, slices, seqlen_q, seqlen_k, device):
        self.prepare_check(slices)

    def prepare_blocks(self, layout: BlockLayout, heads_q: int, device: torch.device) -> SubMask:
        import os

        if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise Unsupported(
                "per-rank kernel 'triton_block_sparse' runs on CUDA, or on CPU only under "
                "Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported)"
            )
        return SubMask(NO_SLICES, int(layout.q_bounds[-1]), int(layout.k_bounds[-1]), _layout_area(layout), {}, layout)

    def __init__(self) -> None:
        self.tiles: set[str] = set()  # the tile configs this instance's plans ran with

    def backend_detail(self) -> str | None:
        """'triton tiles <config>' as single-GPU rows name it (configs of several steps joined by ' | '),
        so a CP row can be compared with single-GPU rows of the same tiles."""
        return "triton tiles " + " | ".join(sorted(self.tiles)) if self.tiles else None

    def _plan(self, sub: SubMask, q: torch.Tensor):
        key = (q.shape[-1], str(q.device))
        if key not in sub.form:
            from longca.kernels.triton_sparse.configs import default_config
            from longca.kernels.triton_sparse.plan import build_plan

            sub.form[key] = build_plan(sub.blocks, q.device, default_config(q.shape[-1], sub.blocks.uniform_block))
        self.tiles.add(sub.form[key].config.as_text())
        return sub.form[key]

    def fwd_parts(self, q, k, v, sub) -> list:
        """All rows as one part, out in the inputs' dtype (no float32 copy before the combination)."""
        from longca.kernels.triton_sparse.api import block_sparse_attn_fwd

        _check_heads(sub, k)
        _gqa(q, k)
        out, lse = block_sparse_attn_fwd(q, k, v, self._plan(sub, q))
        return [Part(out, lse.to(acc_dtype(q.dtype)), 0, q.shape[2])]

    def fwd(self, q, k, v, sub):
        ((out, lse, _, _),) = self.fwd_parts(q, k, v, sub)
        return out.to(acc_dtype(q.dtype)), lse

    def bwd(self, dout, q, k, v, out, lse, sub):
        from longca.kernels.triton_sparse.api import block_sparse_attn_bwd

        _check_heads(sub, k)
        a = acc_dtype(q.dtype)
        grads = block_sparse_attn_bwd(
            q, k, v, out.to(q.dtype).contiguous(), lse.float().contiguous(), dout.to(q.dtype), self._plan(sub, q)
        )
        return tuple(g.to(a) for g in grads)

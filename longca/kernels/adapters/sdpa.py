"""torch.nn.functional.scaled_dot_product_attention with each backend forced.

Shapes: q (B, Hq, S, D), k/v (B, Hkv, S, D) -> out (B, Hq, S, D). GQA through enable_gqa=True.
Full and causal masks use SDPA's own flag; other masks pass a dense boolean attn_mask (S x S
memory, as the paper measured SDPA). The backend that ran is recorded: a forced backend that
cannot take the inputs raises, and the cell is marked unsupported with SDPA's reason.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from longca.kernels.base import Capabilities, Prepared, RankCapabilities, Unsupported
from longca.kernels.lse import Part, combine_parts
from longca.kernels.rank import RankKernel, SubMask, acc_dtype, gqa_groups
from longca.kernels.registry import register
from longca.masks import slices as sl
from longca.masks.mask import Mask
from longca.masks.slices import Kind
from longca.measure.reference import dense_mask_tensor

_BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
_HALF = frozenset({"float16", "bfloat16"})
# torch's flash and cuDNN ops return the LSE and take it in their backward: per-rank kernels on
# FULL and square CAUSAL rectangles (RankSdpa below)
_RANK = RankCapabilities(
    devices=frozenset({"cuda"}),
    dtypes=_HALF,
    slice_kinds=frozenset({Kind.FULL, Kind.CAUSAL}),
    note="FULL / CAUSAL sub-masks only",
)
_PROBE_LEN = 128


def refusal_reason(backend: str, exc: BaseException, warned: list[str]) -> str:
    """'SDPA <backend> backend refused the inputs: <error>; <why, from SDPA's warnings>' (300 chars)."""
    why = []
    for text in warned:
        line = " ".join(text.split())
        if line and line not in why:
            why.append(line)
    reason = f"SDPA {backend} backend refused the inputs: {str(exc).splitlines()[0]}"
    if why:
        reason += "; " + "; ".join(why)
    return reason[:300]


# ------------------------------------------------------------------ its per-rank form (context parallelism)
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


class RankSdpa(RankKernel):
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
        g = gqa_groups(q, k)
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
        g = gqa_groups(q, k)
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


class SdpaAttention:
    layout = "bhsd"

    def __init__(self, backend: str, caps: Capabilities, description: str):
        self.backend = backend
        self.name = f"sdpa_{backend}"
        self.caps = caps
        self.description = description

    def rank_kernel(self) -> RankSdpa:
        """The per-rank kernel of this backend (flash and cuDNN declare `caps.cp`)."""
        return RankSdpa(self.backend)

    def prepare(self, mask: Mask, *, batch, heads_q, heads_kv, head_dim, dtype, device, form) -> Prepared:
        attn_mask = None
        causal = form == "causal"
        if form == "dense":
            dense = dense_mask_tensor(mask, device)
            if dense.shape[0] > 1:  # per-KV-head mask -> per query head
                dense = dense.repeat_interleave(heads_q // heads_kv, dim=0)
            attn_mask = dense.unsqueeze(0)
        gqa = heads_q != heads_kv
        backend = _BACKENDS[self.backend]

        def call(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, enable_gqa=gqa)

        # Fail here (prepare is outside timing) if the forced backend refuses these inputs: a short
        # probe with the same heads, head dim, dtype, flags and a boolean mask when the cell has one
        # (SDPA picks its backend from these; 128 tokens keep the alignment every backend asks for).
        # SDPA says why only in warnings; keep them.
        probe = [
            torch.zeros(1, h, _PROBE_LEN, head_dim, dtype=dtype, device=device) for h in (heads_q, heads_kv, heads_kv)
        ]
        probe_mask = (
            None if attn_mask is None else torch.ones(1, 1, _PROBE_LEN, _PROBE_LEN, dtype=torch.bool, device=device)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(*probe, attn_mask=probe_mask, is_causal=causal, enable_gqa=gqa)
            except RuntimeError as exc:
                raise Unsupported(refusal_reason(self.backend, exc, [str(w.message) for w in caught])) from None
        return Prepared(call=call, layout=self.layout, info={"backend": self.backend})


_ALL = frozenset({"float32", "float16", "bfloat16"})
register(
    SdpaAttention(
        "math",
        Capabilities(frozenset({"full", "causal", "dense"}), _ALL | {"float64"}, devices=frozenset({"cpu", "cuda"})),
        "SDPA, math backend (reference implementation inside torch)",
    )
)
register(
    SdpaAttention(
        "flash",
        Capabilities(
            frozenset({"full", "causal"}),
            _ALL,
            devices=frozenset({"cpu", "cuda"}),
            head_dims=frozenset({64, 96, 128, 192, 256, 16, 32}),
            cp=_RANK,
        ),
        "SDPA, flash backend (FlashAttention-2 inside torch on CUDA; torch's CPU flash kernel on CPU)",
    )
)
register(
    SdpaAttention(
        "efficient",
        Capabilities(frozenset({"full", "causal", "dense"}), _ALL, devices=frozenset({"cuda"})),
        "SDPA, memory-efficient backend (xFormers kernel inside torch)",
    )
)
register(
    SdpaAttention(
        "cudnn",
        Capabilities(
            frozenset({"full", "causal", "dense"}),
            _HALF,
            devices=frozenset({"cuda"}),
            min_compute_capability=(8, 0),
            cp=_RANK,
        ),
        "SDPA, cuDNN fused attention backend",
    )
)

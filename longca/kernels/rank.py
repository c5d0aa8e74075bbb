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

Each kernel's per-rank form lives in its adapter, beside its single-device form
(longca.kernels.adapters): naive (dense mask, explicit formulas, any device and dtype, small S),
flex (BlockMask from longca.masks.flex; backward: Flex's own backward kernel on the combined
out/LSE, longca.kernels.flex_backward), sdpa_flash and sdpa_cudnn (CUDA; the sub-mask is cut into
FULL and square CAUSAL rectangles, one call each), triton_block_sparse (block-sparse masks only:
longca's Triton kernel over the step's block lists). This module holds what they share.

Block-sparse masks (different kept blocks per KV head) have no slices; kernels that take them
(`takes_blocks`) also offer
    prepare_blocks(layout, heads_q, device) -> SubMask
with `layout` the step's local BlockLayout (longca.cp.submask.sub_layout) over exactly the KV
heads the kernel will see (k.shape[1]); heads_q is the local query head count.

Every kernel derives from RankKernel, whose optional parts say what a kernel without them does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from longca.kernels.base import Unsupported
from longca.kernels.lse import Part
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


def layout_area(layout: BlockLayout) -> int:
    return int(layout.area_per_head().sum())


def check_heads(sub: SubMask, k: torch.Tensor) -> None:
    if sub.blocks is not None and sub.blocks.heads != k.shape[1]:
        raise ValueError(f"the step's block layout has {sub.blocks.heads} KV heads, the local k has {k.shape[1]}")


def gqa_groups(q: torch.Tensor, k: torch.Tensor) -> int:
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

"""Public entry points: forward with LSE, backward from a given (out, lse), and autograd.

All tensors are bhsd (batch, heads, seqlen, head_dim), last dimension contiguous; K and V carry
heads_kv heads and Q a multiple of them (GQA); the plan's per-KV-head block lists apply to every
query head of the group.
"""

from __future__ import annotations

import torch

from longca.kernels.triton_sparse.backward import backward as block_sparse_attn_bwd
from longca.kernels.triton_sparse.forward import forward as block_sparse_attn_fwd
from longca.kernels.triton_sparse.plan import SparsePlan

__all__ = ["block_sparse_attention", "block_sparse_attn_bwd", "block_sparse_attn_fwd"]


class _BlockSparseAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan, sm_scale):  # type: ignore[override]
        out, lse = block_sparse_attn_fwd(q, k, v, plan, sm_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.sm_scale = plan, sm_scale
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = block_sparse_attn_bwd(q, k, v, out, lse, dout, ctx.plan, ctx.sm_scale)
        return dq, dk, dv, None, None


def block_sparse_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SparsePlan, sm_scale: float | None = None
) -> torch.Tensor:
    """softmax(q k^T * scale restricted to the plan's kept blocks) v, differentiable in q, k, v."""
    return _BlockSparseAttention.apply(q, k, v, plan, sm_scale)

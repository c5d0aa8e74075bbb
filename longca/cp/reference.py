"""Single-process reference attention over the global mask: plain softmax attention with autograd
(independent of the hand-written backward it checks). Dense: small S only."""

from __future__ import annotations

import math

import torch

from longca.masks import slices as sl
from longca.measure.reference import dense_mask_tensor


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slices,
    dout: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    kv_heads_per_chunk: int | None = None,
):
    """Output (and q/k/v gradients when dout is given) of masked softmax attention.

    `slices`: the mask's slices, or a Mask (per-KV-head masks, e.g. block-sparse, use each KV
    head's own dense mask for the query heads of its group).
    q (B, Hq, S, D), k/v (B, Hkv, S, D); computed in `dtype`, `kv_heads_per_chunk` KV heads (and
    their query heads) at a time to bound memory. Rows without keys give zeros.
    Returns (out, dq, dk, dv) in `dtype` (gradients None without dout)."""
    hk = k.shape[1]
    step = kv_heads_per_chunk or hk
    g = q.shape[1] // hk
    if hasattr(slices, "dense"):  # a Mask
        if slices.per_head and slices.heads != hk:
            raise ValueError(f"the mask has layouts for {slices.heads} KV heads, the inputs {hk}")
        mask = dense_mask_tensor(slices, q.device)
        mask = mask if slices.per_head else mask[0]
    else:
        mask = sl.to_dense_tensor(slices, q.shape[2], k.shape[2], q.device)
    parts = []
    for h0 in range(0, hk, step):
        h1 = min(hk, h0 + step)
        # A per-KV-head mask (Hkv, S, S) gives each query head its KV head's mask.
        m = mask[h0:h1].repeat_interleave(g, 0) if mask.dim() == 3 else mask
        parts.append(
            _attention(
                q[:, h0 * g : h1 * g],
                k[:, h0:h1],
                v[:, h0:h1],
                m,
                None if dout is None else dout[:, h0 * g : h1 * g],
                dtype,
            )
        )
    out = torch.cat([p[0] for p in parts], 1)
    if dout is None:
        return out, None, None, None
    return (out, *(torch.cat([p[i] for p in parts], 1) for i in (1, 2, 3)))


def _attention(q, k, v, mask, dout, dtype):
    d = q.shape[-1]
    g = q.shape[1] // k.shape[1]
    qq, kk, vv = (t.detach().to(dtype).requires_grad_(dout is not None) for t in (q, k, v))
    with torch.set_grad_enabled(dout is not None):
        scores = qq @ kk.repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(~mask, float("-inf"))
        m = scores.amax(-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
        e = torch.exp(scores - m)
        p = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
        out = p @ vv.repeat_interleave(g, 1)
    if dout is None:
        return out.detach(), None, None, None
    dq, dk, dv = torch.autograd.grad(out, (qq, kk, vv), dout.to(dtype))
    return out.detach(), dq, dk, dv


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64 (NaN propagates, so NaN never passes a tolerance)."""
    x64, r64 = x.double(), ref.double()
    den = torch.linalg.vector_norm(r64).item()
    num = torch.linalg.vector_norm(x64 - r64).item()
    return num / den if den > 0 else num

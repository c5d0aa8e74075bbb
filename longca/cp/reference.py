"""Single-process reference attention over the global mask: plain softmax attention with autograd
(independent of the hand-written backward it checks). Dense: small S only."""

from __future__ import annotations

import math

import numpy as np
import torch

from longca.masks import slices as sl


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slices: np.ndarray,
                        dout: torch.Tensor | None = None, dtype: torch.dtype = torch.float64):
    """Output (and q/k/v gradients when dout is given) of masked softmax attention.

    q (B, Hq, S, D), k/v (B, Hkv, S, D); computed in `dtype`. Rows without keys give zeros.
    Returns (out, dq, dk, dv) in `dtype` (gradients None without dout)."""
    b, hq, s, d = q.shape
    g = hq // k.shape[1]
    mask = torch.from_numpy(sl.to_dense(slices, s, k.shape[2])).to(q.device)
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

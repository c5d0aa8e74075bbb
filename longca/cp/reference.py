"""Single-process reference attention over the global mask for the CP mechanisms, in their (B, H, S, D)
layout: the single-device reference with autograd (independent of the hand-written backward it
checks), a few KV heads at a time. Dense: small S only."""

from __future__ import annotations

import numpy as np
import torch

from longca.masks import slices as sl
from longca.masks.mask import Mask
from longca.measure.reference import dense_mask_tensor
from longca.measure.reference import reference_attention as single_device_reference


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slices: np.ndarray | Mask,
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
    if isinstance(slices, Mask):
        if slices.per_head and slices.heads != hk:
            raise ValueError(f"the mask has layouts for {slices.heads} KV heads, the inputs {hk}")
        mask = dense_mask_tensor(slices, q.device)
        mask = mask if slices.per_head else mask[0]
    else:
        mask = sl.to_dense_tensor(slices, q.shape[2], k.shape[2], q.device)
    parts = []
    for h0 in range(0, hk, step):
        h1 = min(hk, h0 + step)
        # a per-KV-head mask (Hkv, S, S): the reference gives each query head its KV head's
        m = mask[h0:h1] if mask.dim() == 3 else mask
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
    """One head group through the single-device reference (longca.measure.reference), which takes
    (B, S, H, D): the same definition checks every kernel and every CP mechanism."""
    dense = mask if mask.dim() == 3 else mask.unsqueeze(0)
    qq, kk, vv = (t.detach().to(dtype).transpose(1, 2).contiguous().requires_grad_(dout is not None) for t in (q, k, v))
    with torch.set_grad_enabled(dout is not None):
        out = single_device_reference(qq, kk, vv, dense)
    if dout is None:
        return out.detach().transpose(1, 2), None, None, None
    grads = torch.autograd.grad(out, (qq, kk, vv), dout.to(dtype).transpose(1, 2))
    return (out.detach().transpose(1, 2), *(x.transpose(1, 2) for x in grads))

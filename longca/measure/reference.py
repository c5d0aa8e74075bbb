"""The high-precision reference every kernel is checked against (forward and gradients)."""

from __future__ import annotations

import math

import numpy as np
import torch

from longca.masks import slices as sl
from longca.masks.mask import Mask


def dense_mask_tensor(mask: Mask, device: torch.device) -> torch.Tensor:
    """(1 | Hkv, Sq, Sk) boolean tensor of the mask, built on `device` (equal to `mask.dense()`)."""
    device = torch.device(device)
    if mask.blocks is not None:
        b = mask.blocks
        kept = torch.as_tensor(np.ascontiguousarray(b.kept), device=device)
        rq = torch.as_tensor(np.diff(b.q_bounds), device=device)
        rk = torch.as_tensor(np.diff(b.k_bounds), device=device)
        return kept.repeat_interleave(rq, dim=1).repeat_interleave(rk, dim=2)
    if mask.head_slices is not None:
        return torch.stack([sl.to_dense_tensor(s, mask.seqlen_q, mask.seqlen_k, device) for s in mask.head_slices])
    return sl.to_dense_tensor(mask.slices, mask.seqlen_q, mask.seqlen_k, device).unsqueeze(0)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dense: torch.Tensor,
    scale: float | None = None,
    q_chunk: int = 1024,
) -> torch.Tensor:
    """Masked softmax attention in the inputs' dtype (use float32/float64 inputs), layout bshd.

    q: (B, Sq, Hq, D); k, v: (B, Sk, Hkv, D); dense: (1 | Hkv, Sq, Sk) bool. GQA: query head h uses
    KV head h // (Hq / Hkv). Rows with no allowed key give zeros. Differentiable (autograd) for the
    gradient reference; queries are processed in chunks to bound memory.
    """
    b, sq, hq, d = q.shape
    hkv = k.shape[2]
    group = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qh = q.transpose(1, 2)  # B, Hq, Sq, D
    kh = k.transpose(1, 2).repeat_interleave(group, dim=1)
    vh = v.transpose(1, 2).repeat_interleave(group, dim=1)
    if dense.shape[0] > 1:  # per-KV-head masks -> per query head
        dense = dense.repeat_interleave(group, dim=0)
    outs = []
    for s in range(0, sq, q_chunk):
        scores = torch.matmul(qh[:, :, s : s + q_chunk], kh.transpose(-1, -2)) * scale
        allowed = dense[:, s : s + q_chunk].unsqueeze(0)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        probs = torch.nan_to_num(probs, nan=0.0)  # fully-masked rows
        outs.append(torch.matmul(probs, vh))
    return torch.cat(outs, dim=2).transpose(1, 2)


def relative_error(x: torch.Tensor, ref: torch.Tensor, chunk_elems: int = 1 << 24) -> float:
    """||x - ref|| / ||ref|| in float64; NaN or Inf anywhere gives inf (never passes).

    Summed in float64 over slices of the sequence dimension (dim 1, or dim 0 of a 1-D tensor) of at
    most `chunk_elems` elements, so a full-length comparison at 512K tokens (8 GiB per bf16 output)
    needs a slice's float64 copy, not two whole ones."""
    return error_ratio(*error_sums(x, ref, chunk_elems))


def error_sums(x: torch.Tensor, ref: torch.Tensor, chunk_elems: int = 1 << 24) -> tuple[float, float]:
    """(||x - ref||^2, ||ref||^2) in float64, summed as `relative_error` does; (inf, inf) where x has
    a NaN or Inf. Sums of parts (head groups of one tensor) add up to the whole's. `ref` may live on
    the host while `x` is on the device: it is moved a chunk at a time."""
    if x.shape != ref.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} and {tuple(ref.shape)}")
    dim = 1 if x.dim() > 1 else 0
    n = x.shape[dim] if x.dim() else 1
    per_step = max(1, x.numel() // max(n, 1))
    step = max(1, chunk_elems // per_step)
    num = denom = 0.0
    for i in range(0, n, step):
        xs = x.detach().narrow(dim, i, min(step, n - i)) if x.dim() else x.detach()
        rs = ref.detach().narrow(dim, i, min(step, n - i)) if x.dim() else ref.detach()
        rs = rs.to(xs.device)  # a host-held reference moves one chunk at a time
        x64, r64 = xs.to(torch.float64), rs.to(torch.float64)
        if not torch.isfinite(x64).all():
            return float("inf"), float("inf")
        denom += float(torch.linalg.vector_norm(r64).item()) ** 2
        num += float(torch.linalg.vector_norm(x64 - r64).item()) ** 2
    return num, denom


def error_ratio(num: float, denom: float) -> float:
    """||x - ref|| / ||ref|| from `error_sums`' two sums (the difference's norm where ref is zero)."""
    if num == float("inf"):
        return num  # a NaN or Inf in x (inf / inf would read NaN)
    num, denom = num**0.5, denom**0.5
    return num / denom if denom > 0 else num

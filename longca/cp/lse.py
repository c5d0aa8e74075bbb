"""Combining partial attention results by log-sum-exp.

Each partial result is (out_i, lse_i) over a disjoint set of keys; the combined softmax output is
out = sum_i exp(lse_i - L) out_i with L = log(sum_i exp(lse_i)). Rows with no key anywhere keep
lse = -inf and out = 0 (no NaN). Shapes: out (B, H, S, D), lse (B, H, S).
"""

from __future__ import annotations

import torch


def merge_(out: torch.Tensor, lse: torch.Tensor, out_i: torch.Tensor, lse_i: torch.Tensor) -> None:
    """In place: (out, lse) <- combination of (out, lse) and (out_i, lse_i). out/lse are float32+."""
    new = torch.logaddexp(lse, lse_i.to(lse.dtype))
    finite = torch.isfinite(new)
    safe = torch.where(finite, new, torch.zeros_like(new))
    w_old = torch.where(finite, torch.exp(lse - safe), torch.zeros_like(new)).unsqueeze(-1)
    w_new = torch.where(finite, torch.exp(lse_i.to(lse.dtype) - safe), torch.zeros_like(new)).unsqueeze(-1)
    out.mul_(w_old).add_(out_i.to(out.dtype) * w_new)
    lse.copy_(new)


def combine(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine a list of (out_i, lse_i) into (out, lse) in float32 (or float64 if given)."""
    if not parts:
        raise ValueError("combine needs at least one partial result")
    acc_dtype = torch.promote_types(parts[0][0].dtype, torch.float32)
    out = torch.zeros_like(parts[0][0], dtype=acc_dtype)
    lse = torch.full_like(parts[0][1], float("-inf"), dtype=acc_dtype)
    for o, l in parts:
        merge_(out, lse, o, l)
    return out, lse

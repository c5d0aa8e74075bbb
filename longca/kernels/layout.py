"""Moving q, k, v and results between a kernel's layout and (batch, seqlen, heads, head dim).

A kernel takes its inputs in its own layout (longca.vocab.Layout: `bshd`, `bhsd`, or `thd` with the
batch's tokens packed); the checks and the full-length agreement compare results as (B, S, H, D).
One pair of functions for both: the cell runner draws inputs and hands results over, the agreement
feeds a comparator and reads its results back.
"""

from __future__ import annotations

import torch


def to_bshd(x: torch.Tensor, layout: str, batch: int) -> torch.Tensor:
    """`x` in `layout` as (B, S, H, D): a view where the layout allows one."""
    if layout == "bhsd":
        return x.transpose(1, 2)
    if layout == "thd":
        return x.reshape(batch, -1, x.shape[-2], x.shape[-1])
    return x


def from_bshd(x: torch.Tensor, layout: str) -> torch.Tensor:
    """A (B, S, H, D) tensor in `layout`, contiguous (kernels take dense inputs)."""
    if layout == "bhsd":
        return x.transpose(1, 2).contiguous()
    if layout == "thd":
        return x.reshape(-1, x.shape[-2], x.shape[-1]).contiguous()
    return x.contiguous()

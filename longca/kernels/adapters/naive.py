"""Naive PyTorch attention: matmul, masked softmax, matmul, with a dense boolean mask.

Shapes: q (B, Hq, S, D), k/v (B, Hkv, S, D) -> out (B, Hq, S, D). Memory is O(Hq * S^2): it is the
baseline that runs out of memory first, as in the paper.
"""

from __future__ import annotations

import math

import torch

from longca.kernels import rank
from longca.kernels.base import Capabilities, Prepared, RankCapabilities
from longca.kernels.registry import register
from longca.masks.mask import Mask
from longca.measure.reference import dense_mask_tensor


class NaiveAttention:
    name = "naive"
    layout = "bhsd"
    description = "matmul + masked softmax + matmul in PyTorch (dense mask)"
    caps = Capabilities(
        mask_forms=frozenset({"full", "dense"}),
        dtypes=frozenset({"float32", "float16", "bfloat16", "float64"}),
        devices=frozenset({"cpu", "cuda"}),
        cp=RankCapabilities(
            devices=frozenset({"cpu", "cuda"}),
            dtypes=frozenset({"float64", "float32", "bfloat16", "float16"}),
            block_sparse=rank.Naive.takes_blocks,
            note="dense mask per step; O(S^2) memory",
        ),
    )

    def rank_kernel(self) -> rank.Naive:
        return rank.Naive()

    def prepare(self, mask: Mask, *, batch, heads_q, heads_kv, head_dim, dtype, device, form) -> Prepared:
        group = heads_q // heads_kv
        scale = 1.0 / math.sqrt(head_dim)
        allowed = None if form == "full" else dense_mask_tensor(mask, device)
        if allowed is not None and allowed.shape[0] > 1:
            allowed = allowed.repeat_interleave(group, dim=0)

        def call(q, k, v):
            if group > 1:
                k = k.repeat_interleave(group, dim=1)
                v = v.repeat_interleave(group, dim=1)
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
            return torch.matmul(probs, v)

        return Prepared(call=call, layout=self.layout, info={"backend": "naive"})


register(NaiveAttention())

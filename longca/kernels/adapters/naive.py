"""Naive PyTorch attention: matmul, masked softmax, matmul, with a dense boolean mask.

Shapes: q (B, Hq, S, D), k/v (B, Hkv, S, D) -> out (B, Hq, S, D). Memory is O(Hq * S^2): it is the
baseline that runs out of memory first, as in the paper.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from longca.kernels.base import Capabilities, Prepared, RankCapabilities
from longca.kernels.rank import NO_SLICES, RankKernel, SubMask, acc_dtype, check_heads, gqa_groups, layout_area
from longca.kernels.registry import register
from longca.masks import slices as sl
from longca.masks.blocks import BlockLayout
from longca.masks.mask import Mask
from longca.measure.reference import dense_mask_tensor


# ------------------------------------------------------------------ its per-rank form (context parallelism)
class RankNaive(RankKernel):
    """Dense scores and an explicit backward. Memory O(B Hq Sq Sk): references and small S only."""

    name = "naive"
    takes_blocks = True

    def prepare(self, slices: np.ndarray, seqlen_q: int, seqlen_k: int, device: torch.device) -> SubMask:
        dense = sl.to_dense_tensor(slices, seqlen_q, seqlen_k, device)
        return SubMask(slices, seqlen_q, seqlen_k, sl.area(slices), dense)

    def prepare_blocks(self, layout: BlockLayout, heads_q: int, device: torch.device) -> SubMask:
        """Dense per-KV-head mask (Hkv, 1, Sq, Sk): broadcasts over the GQA group dimension."""
        from longca.masks.mask import Mask
        from longca.measure.reference import dense_mask_tensor

        sq, sk = int(layout.q_bounds[-1]), int(layout.k_bounds[-1])
        form = dense_mask_tensor(Mask("cp_step", sq, sk, NO_SLICES, blocks=layout), device).unsqueeze(1)
        return SubMask(NO_SLICES, sq, sk, layout_area(layout), form, layout)

    @staticmethod
    def _scores(q, k, sub):
        g = gqa_groups(q, k)
        b, hq, sq, d = q.shape
        a = acc_dtype(q.dtype)
        qg = q.to(a).view(b, hq // g, g, sq, d)
        s = qg @ k.to(a).unsqueeze(2).transpose(-1, -2) / math.sqrt(d)
        return s, g  # (B, Hkv, G, Sq, Sk)

    def fwd(self, q, k, v, sub):
        check_heads(sub, k)
        b, hq, sq, d = q.shape
        s, g = self._scores(q, k, sub)
        s = s.masked_fill(~sub.form, float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.where(sub.form & torch.isfinite(lse).unsqueeze(-1), torch.exp(s - lse.unsqueeze(-1)), 0.0)
        out = p @ v.to(s.dtype).unsqueeze(2)
        return out.reshape(b, hq, sq, -1), lse.reshape(b, hq, sq)

    def bwd(self, dout, q, k, v, out, lse, sub):
        check_heads(sub, k)
        b, hq, sq, d = q.shape
        hk = k.shape[1]
        s, g = self._scores(q, k, sub)
        a = s.dtype
        lse5 = lse.to(a).view(b, hk, g, sq, 1)
        p = torch.where(sub.form & torch.isfinite(lse5), torch.exp(s - lse5), 0.0)
        do = dout.to(a).view(b, hk, g, sq, -1)
        o = out.to(a).view(b, hk, g, sq, -1)
        dv = (p.transpose(-1, -2) @ do).sum(2)
        dp = do @ v.to(a).unsqueeze(2).transpose(-1, -2)
        delta = (do * o).sum(-1, keepdim=True)
        ds = p * (dp - delta) / math.sqrt(d)
        dq = (ds @ k.to(a).unsqueeze(2)).reshape(b, hq, sq, d)
        dk = (ds.transpose(-1, -2) @ q.to(a).view(b, hk, g, sq, d)).sum(2)
        return dq, dk, dv


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
            block_sparse=RankNaive.takes_blocks,
            note="dense mask per step; O(S^2) memory",
        ),
    )

    def rank_kernel(self) -> RankNaive:
        return RankNaive()

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

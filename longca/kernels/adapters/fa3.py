"""FlashAttention-3 (the Hopper build of flash-attention: module `flash_attn_interface`).

Shapes (layout bshd, every form): q (B, S, Hq, D), k/v (B, S, Hkv, D) -> out (B, S, Hq, D). In the
varlen form the call views them as (B*S, H, D) packed documents (no copy) with int32 cu_seqlens
over the documents of every batch element. GQA natively.

Masks: full; causal; sliding windows (window_size=(left, right)); full/causal documents
(flash_attn_varlen_func). FA3 is sm90 only (H100/H200), fp16/bf16 with backward (its fp8 path is
forward only and not used here), head dims 64/96/128/192/256. Some FA3 releases return
(out, softmax_lse); the adapter keeps out either way.
"""

from __future__ import annotations

from longca.kernels.adapters._flash_args import FlashAdapter
from longca.kernels.base import Capabilities
from longca.kernels.registry import register


class FlashAttention3(FlashAdapter):
    name = "fa3"
    description = "FlashAttention-3 (flash_attn_interface.flash_attn_func / flash_attn_varlen_func, Hopper)"
    caps = Capabilities(
        mask_forms=frozenset({"full", "causal", "window", "varlen"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({64, 96, 128, 192, 256}),
        gqa=True,
        backward=True,
        min_compute_capability=(9, 0),
        max_compute_capability=(9, 0),
        package="flash_attn_interface",
    )

    def functions(self):
        """(flash_attn_func, flash_attn_varlen_func) of the Hopper build; keyword causal=, window_size=."""
        from flash_attn_interface import flash_attn_func, flash_attn_varlen_func

        return flash_attn_func, flash_attn_varlen_func


register(FlashAttention3())

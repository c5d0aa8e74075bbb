"""FlashAttention-2 (package `flash_attn`, >= 2.3 for window_size), for users who have it installed.

Shapes (layout bshd, every form): q (B, S, Hq, D), k/v (B, S, Hkv, D) -> out (B, S, Hq, D). In the
varlen form the call views them as (B*S, H, D) packed documents (no copy) with int32 cu_seqlens
over the documents of every batch element. GQA natively (Hq a multiple of Hkv).

Masks: full; causal (causal=True); sliding windows (window_size=(left, right)); full/causal
documents (flash_attn_varlen_func). FA2 needs sm80+, fp16/bf16 and head dim <= 256 (multiple of 8).
"""

from __future__ import annotations

from longca.kernels.adapters._flash_args import FlashAdapter
from longca.kernels.base import Capabilities
from longca.kernels.registry import register


class FlashAttention2(FlashAdapter):
    name = "fa2"
    description = "FlashAttention-2 (flash_attn.flash_attn_func / flash_attn_varlen_func)"
    caps = Capabilities(
        mask_forms=frozenset({"full", "causal", "window", "varlen"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({32, 64, 96, 128, 160, 192, 224, 256}),
        gqa=True,
        backward=True,
        min_compute_capability=(8, 0),
        # FA2's own module: FlashAttention-4 installs the `flash_attn` namespace too (flash_attn.cute)
        package="flash_attn.flash_attn_interface",
    )

    def functions(self):
        """(flash_attn_func, flash_attn_varlen_func); both take causal= and window_size=."""
        from flash_attn import flash_attn_func, flash_attn_varlen_func

        return flash_attn_func, flash_attn_varlen_func


register(FlashAttention2())

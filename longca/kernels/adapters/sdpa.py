"""torch.nn.functional.scaled_dot_product_attention with each backend forced.

Shapes: q (B, Hq, S, D), k/v (B, Hkv, S, D) -> out (B, Hq, S, D). GQA through enable_gqa=True.
Full and causal masks use SDPA's own flag; other masks pass a dense boolean attn_mask (S x S
memory, as the paper measured SDPA). The backend that ran is recorded: a forced backend that
cannot take the inputs raises, and the cell is marked unsupported with SDPA's reason.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from longca.kernels.base import Capabilities, Prepared, Unsupported
from longca.kernels.registry import register
from longca.masks.mask import Mask
from longca.measure.reference import dense_mask_tensor

_BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
_HALF = frozenset({"float16", "bfloat16"})


class SdpaAttention:
    layout = "bhsd"

    def __init__(self, backend: str, caps: Capabilities, description: str):
        self.backend = backend
        self.name = f"sdpa_{backend}"
        self.caps = caps
        self.description = description

    def prepare(self, mask: Mask, *, batch, heads_q, heads_kv, head_dim, dtype, device, form) -> Prepared:
        attn_mask = None
        causal = form == "causal"
        if form == "dense":
            dense = dense_mask_tensor(mask, device)
            if dense.shape[0] > 1:  # per-KV-head mask -> per query head
                dense = dense.repeat_interleave(heads_q // heads_kv, dim=0)
            attn_mask = dense.unsqueeze(0)
        gqa = heads_q != heads_kv
        backend = _BACKENDS[self.backend]

        def call(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal,
                                                      enable_gqa=gqa)

        # Fail here (prepare is outside timing) if the forced backend refuses these inputs.
        probe = [torch.zeros(1, h, 16, head_dim, dtype=dtype, device=device) for h in (heads_q, heads_kv, heads_kv)]
        if attn_mask is None:
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(*probe, is_causal=causal, enable_gqa=gqa)
            except RuntimeError as exc:
                raise Unsupported(f"SDPA {self.backend} backend refused the inputs: {str(exc).splitlines()[0][:300]}")
        return Prepared(call=call, layout=self.layout, info={"backend": self.backend})


_ALL = frozenset({"float32", "float16", "bfloat16"})
register(SdpaAttention("math", Capabilities(frozenset({"full", "causal", "dense"}), _ALL | {"float64"},
                                             devices=frozenset({"cpu", "cuda"})),
                       "SDPA, math backend (reference implementation inside torch)"))
register(SdpaAttention("flash", Capabilities(frozenset({"full", "causal"}), _ALL, devices=frozenset({"cpu", "cuda"}),
                                              head_dims=frozenset({64, 96, 128, 192, 256, 16, 32})),
                       "SDPA, flash backend (FlashAttention-2 inside torch on CUDA; torch's CPU flash kernel on CPU)"))
register(SdpaAttention("efficient", Capabilities(frozenset({"full", "causal", "dense"}), _ALL,
                                                  devices=frozenset({"cuda"})),
                       "SDPA, memory-efficient backend (xFormers kernel inside torch)"))
register(SdpaAttention("cudnn", Capabilities(frozenset({"full", "causal", "dense"}), _HALF, devices=frozenset({"cuda"}),
                                              min_compute_capability=(8, 0)),
                       "SDPA, cuDNN fused attention backend"))

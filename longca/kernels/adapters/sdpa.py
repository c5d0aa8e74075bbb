"""torch.nn.functional.scaled_dot_product_attention with each backend forced.

Shapes: q (B, Hq, S, D), k/v (B, Hkv, S, D) -> out (B, Hq, S, D). GQA through enable_gqa=True.
Full and causal masks use SDPA's own flag; other masks pass a dense boolean attn_mask (S x S
memory, as the paper measured SDPA). The backend that ran is recorded: a forced backend that
cannot take the inputs raises, and the cell is marked unsupported with SDPA's reason.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from longca.kernels import rank
from longca.kernels.base import Capabilities, Prepared, RankCapabilities, Unsupported
from longca.kernels.registry import register
from longca.masks.mask import Mask
from longca.masks.slices import Kind
from longca.measure.reference import dense_mask_tensor

_BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
_HALF = frozenset({"float16", "bfloat16"})
# torch's flash and cuDNN ops return the LSE and take it in their backward: per-rank kernels on
# FULL and square CAUSAL rectangles (longca.kernels.rank.Sdpa)
_RANK = RankCapabilities(
    devices=frozenset({"cuda"}),
    dtypes=_HALF,
    slice_kinds=frozenset({Kind.FULL, Kind.CAUSAL}),
    note="FULL / CAUSAL sub-masks only",
)
_PROBE_LEN = 128


def refusal_reason(backend: str, exc: BaseException, warned: list[str]) -> str:
    """'SDPA <backend> backend refused the inputs: <error>; <why, from SDPA's warnings>' (300 chars)."""
    why = []
    for text in warned:
        line = " ".join(text.split())
        if line and line not in why:
            why.append(line)
    reason = f"SDPA {backend} backend refused the inputs: {str(exc).splitlines()[0]}"
    if why:
        reason += "; " + "; ".join(why)
    return reason[:300]


class SdpaAttention:
    layout = "bhsd"

    def __init__(self, backend: str, caps: Capabilities, description: str):
        self.backend = backend
        self.name = f"sdpa_{backend}"
        self.caps = caps
        self.description = description

    def rank_kernel(self) -> rank.Sdpa:
        """The per-rank kernel of this backend (flash and cuDNN declare `caps.cp`)."""
        return rank.Sdpa(self.backend)

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
                return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal, enable_gqa=gqa)

        # Fail here (prepare is outside timing) if the forced backend refuses these inputs: a short
        # probe with the same heads, head dim, dtype, flags and a boolean mask when the cell has one
        # (SDPA picks its backend from these; 128 tokens keep the alignment every backend asks for).
        # SDPA says why only in warnings; keep them.
        probe = [
            torch.zeros(1, h, _PROBE_LEN, head_dim, dtype=dtype, device=device) for h in (heads_q, heads_kv, heads_kv)
        ]
        probe_mask = (
            None if attn_mask is None else torch.ones(1, 1, _PROBE_LEN, _PROBE_LEN, dtype=torch.bool, device=device)
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(*probe, attn_mask=probe_mask, is_causal=causal, enable_gqa=gqa)
            except RuntimeError as exc:
                raise Unsupported(refusal_reason(self.backend, exc, [str(w.message) for w in caught])) from None
        return Prepared(call=call, layout=self.layout, info={"backend": self.backend})


_ALL = frozenset({"float32", "float16", "bfloat16"})
register(
    SdpaAttention(
        "math",
        Capabilities(frozenset({"full", "causal", "dense"}), _ALL | {"float64"}, devices=frozenset({"cpu", "cuda"})),
        "SDPA, math backend (reference implementation inside torch)",
    )
)
register(
    SdpaAttention(
        "flash",
        Capabilities(
            frozenset({"full", "causal"}),
            _ALL,
            devices=frozenset({"cpu", "cuda"}),
            head_dims=frozenset({64, 96, 128, 192, 256, 16, 32}),
            cp=_RANK,
        ),
        "SDPA, flash backend (FlashAttention-2 inside torch on CUDA; torch's CPU flash kernel on CPU)",
    )
)
register(
    SdpaAttention(
        "efficient",
        Capabilities(frozenset({"full", "causal", "dense"}), _ALL, devices=frozenset({"cuda"})),
        "SDPA, memory-efficient backend (xFormers kernel inside torch)",
    )
)
register(
    SdpaAttention(
        "cudnn",
        Capabilities(
            frozenset({"full", "causal", "dense"}),
            _HALF,
            devices=frozenset({"cuda"}),
            min_compute_capability=(8, 0),
            cp=_RANK,
        ),
        "SDPA, cuDNN fused attention backend",
    )
)

"""torch.nn.attention.varlen.varlen_attn: packed documents through torch's own FlashAttention-2.

Shapes (layout thd): q (B*S, Hq, D), k/v (B*S, Hkv, D) -> out (B*S, Hq, D). The runner packs the
batch into one token axis; cu_seqlens (int32) hold the documents of every batch element back to
back. Full and causal masks are one document per batch element.

The signature moved between torch releases, so arguments are mapped from what this torch's
varlen_attn accepts: causality as `window_size=(-1, 0)` (torch 2.10+), or `is_causal=` where that
exists; GQA through `enable_gqa=True` (torch 2.13; without it, Hq != Hkv is unsupported). It runs
on CUDA only (aten::_flash_attention_forward has no CPU kernel), sm80+, fp16/bf16.
"""

from __future__ import annotations

import inspect
import time

import torch

from longca.kernels.adapters._flash_args import flash_mask_args
from longca.kernels.base import Capabilities, Prepared, Unsupported, sync
from longca.kernels.registry import register
from longca.masks.mask import Mask


def varlen_kwargs(params, *, causal: bool, gqa: bool) -> dict:
    """Keyword arguments for this torch's varlen_attn; `params` are its parameter names."""
    kwargs: dict = {}
    if "window_size" in params:
        kwargs["window_size"] = (-1, 0) if causal else (-1, -1)
    elif "is_causal" in params:
        kwargs["is_causal"] = causal
    elif causal:
        raise Unsupported("this torch's varlen_attn takes neither window_size nor is_causal")
    if gqa:
        if "enable_gqa" not in params:
            raise Unsupported("this torch's varlen_attn has no enable_gqa (GQA needs torch >= 2.13)")
        kwargs["enable_gqa"] = True
    return kwargs


class VarlenAttention:
    name = "varlen"
    layout = "thd"
    description = "torch.nn.attention.varlen.varlen_attn (FlashAttention-2 inside torch), packed documents"
    caps = Capabilities(
        mask_forms=frozenset({"varlen"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({32, 64, 96, 128, 160, 192, 224, 256}),
        gqa=True,  # where this torch's varlen_attn has enable_gqa; prepare says unsupported otherwise
        backward=True,
        min_compute_capability=(8, 0),
        package="torch.nn.attention.varlen",
    )

    def prepare(
        self,
        mask: Mask,
        *,
        batch: int,
        heads_q: int,
        heads_kv: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        form: str,
    ) -> Prepared:
        if form != "varlen":
            raise Unsupported(f"varlen takes the varlen form, not {form!r}")
        from torch.nn.attention.varlen import varlen_attn

        device = torch.device(device)
        t0 = time.perf_counter()
        args = flash_mask_args(mask, form, batch)
        params = inspect.signature(varlen_attn).parameters
        kwargs = varlen_kwargs(params, causal=args.causal, gqa=heads_q != heads_kv)
        cu = torch.as_tensor(args.cu_seqlens, dtype=torch.int32, device=device)
        m = args.max_seqlen
        sync(device)
        build_s = time.perf_counter() - t0

        def call(q, k, v):
            return varlen_attn(q, k, v, cu, cu, m, m, **kwargs)

        info = {
            "causal": args.causal,
            "num_segments": len(args.cu_seqlens) - 1,
            "max_seqlen": m,
            "kwargs": sorted(kwargs),
        }
        return Prepared(call=call, layout="thd", build_s=build_s, info=info)


register(VarlenAttention())

"""cuDNN's interval-mask attention (`cudnn.flex_attention` in NVIDIA's `nvidia-cudnn-frontend`).

Each query's visible keys are a union of intervals [0,F0) U [F1,F2) U ...: an int32 tensor
(1, nfunc, total_q) of endpoints, derived from the mask's slices (longca.masks.forms.interval_form),
turned into a plan once per (mask, shape) by `create_mask_plan` (it compiles on first use: recorded
as mask build time, outside kernel time), then `flex_attn_func(q, k, v, mask_plan=plan)`.

- `cudnn_flex`: fixed length, BSHD: q (B, S, Hq, D), k/v (B, S, Hkv, D) -> out (B, S, Hq, D); every
  static mask (block-sparse layouts have no interval form).
- `cudnn_flex_varlen`: the document-local masks (full, causal, prefix-LM and block-causal
  documents: every pair inside one document) through the variable-length THD path: the batch's
  documents packed as one sequence (a free view of the BSHD input), endpoints relative to each
  document's first token, cu_seqlens over the documents.

GQA natively; forward and backward; fp16/bf16. Needs the CuTe DSL runtime that FlashAttention-4
brings (`nvidia-cutlass-dsl`). The plan holds a backward payload only when the cell has a backward,
so forward cells are prepared (and checked) without one (`grad_changes_form`). Where the library
refuses a shape (a head dim, an architecture), its message is the row's `unsupported` reason.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from longca.kernels.base import Capabilities, Prepared, Unsupported, sync
from longca.kernels.registry import register
from longca.masks.forms import document_interval_form, interval_form
from longca.masks.mask import Mask

PACKAGE = "cudnn.flex_attention"
# what cuDNN's plan builder and call raise for a shape they refuse (their validation)
REFUSALS = (ValueError, TypeError, NotImplementedError)


def _plan(mask_func: np.ndarray, samples: tuple[torch.Tensor, ...], grad: bool, **varlen) -> object:
    from cudnn.flex_attention import create_mask_plan

    device = samples[0].device
    endpoints = torch.from_numpy(np.ascontiguousarray(mask_func[None])).to(device=device, dtype=torch.int32)
    try:
        return create_mask_plan(endpoints, *samples, build_backward=grad, **varlen)
    except REFUSALS as exc:
        raise Unsupported(f"cuDNN interval-mask attention: {type(exc).__name__}: {exc}"[:500]) from None


def _samples(shape_q, shape_kv, dtype, device) -> tuple[torch.Tensor, ...]:
    """Tensors of the call's shapes and dtype for the plan (it reads their geometry, not values)."""
    return tuple(torch.empty(s, dtype=dtype, device=device) for s in (shape_q, shape_kv, shape_kv))


class CudnnInterval:
    name = "cudnn_flex"
    layout = "bshd"
    description = "cuDNN interval-mask attention (cudnn.flex_attention), fixed-length BSHD, intervals from the slices"
    caps = Capabilities(
        mask_forms=frozenset({"intervals"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        devices=frozenset({"cuda"}),
        gqa=True,
        backward=True,
        min_compute_capability=(9, 0),
        package=PACKAGE,
    )

    def grad_changes_form(self, mask: Mask, *, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
        return True  # the plan carries the backward payload only when asked

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
        grad: bool = True,
    ) -> Prepared:
        from cudnn.flex_attention import flex_attn_func

        if form != "intervals":
            raise Unsupported(f"{self.name} takes the intervals form, not {form!r}")
        t0 = time.perf_counter()
        s = mask.seqlen_q
        endpoints = interval_form(mask)
        plan = _plan(
            endpoints, _samples((batch, s, heads_q, head_dim), (batch, s, heads_kv, head_dim), dtype, device), grad
        )
        sync(device)

        def call(q, k, v):
            return flex_attn_func(q, k, v, mask_plan=plan)

        info = {"backend": f"cudnn flex intervals nfunc={endpoints.shape[0]}"}
        return Prepared(call=call, layout=self.layout, build_s=time.perf_counter() - t0, info=info)


class CudnnIntervalVarlen(CudnnInterval):
    name = "cudnn_flex_varlen"
    description = "cuDNN interval-mask attention (cudnn.flex_attention), variable-length THD over the documents"
    caps = Capabilities(
        mask_forms=frozenset({"document_intervals"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        devices=frozenset({"cuda"}),
        gqa=True,
        backward=True,
        min_compute_capability=(9, 0),
        package=PACKAGE,
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
        grad: bool = True,
    ) -> Prepared:
        from cudnn.flex_attention import flex_attn_func

        if form != "document_intervals":
            raise Unsupported(f"{self.name} takes the document_intervals form, not {form!r}")
        t0 = time.perf_counter()
        s = mask.seqlen_q
        docs, endpoints = document_interval_form(mask)
        # every batch element holds the same documents: B x the offsets, one packed sequence
        offsets = np.concatenate([[0], (docs.cu_seqlens[1:] + s * np.arange(batch)[:, None]).ravel()])
        cu = torch.from_numpy(offsets.astype(np.int32)).to(device)
        total = batch * s
        plan = _plan(
            np.tile(endpoints, (1, batch)),
            _samples((total, heads_q, head_dim), (total, heads_kv, head_dim), dtype, device),
            grad,
            cu_seqlens_q=cu,
            cu_seqlens_k=cu,
            max_seqlen_q=docs.max_seqlen,
            max_seqlen_k=docs.max_seqlen,
        )
        sync(device)

        def call(q, k, v):
            b, sq = q.shape[:2]
            out = flex_attn_func(
                q.reshape(b * sq, *q.shape[2:]),
                k.reshape(b * sq, *k.shape[2:]),
                v.reshape(b * sq, *v.shape[2:]),
                mask_plan=plan,
            )
            return out.view(b, sq, *out.shape[1:])

        info = {"backend": f"cudnn flex varlen THD documents={len(docs.cu_seqlens) - 1} nfunc={endpoints.shape[0]}"}
        return Prepared(call=call, layout=self.layout, build_s=time.perf_counter() - t0, info=info)


register(CudnnInterval())
register(CudnnIntervalVarlen())

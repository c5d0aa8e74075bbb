"""cuDNN's block-sparse attention (`cudnn.block_sparse_attention` in NVIDIA's `nvidia-cudnn-frontend`).

The sparse pattern is, per (batch, query head, query block), the list of kept KV block ids on a
fixed grid of 64 or 128 tokens: an int32 tensor (B, Hq, n_q_blocks, kept) built from the mask's
BlockLayout (`block_index_form`; per KV head, repeated over each group's query heads) in prepare()
(recorded as build time). The kernels are CuTe DSL (the runtime FlashAttention-4 brings) and compile
on the first call of each shape, in the warm-up.

q (B, Hq, S, D), k/v (B, Hkv, S, D) -> out (B, Hq, S, D) ("bhsd").

Limits, as the library's own validation states them (api.py of nvidia-cudnn-frontend 1.32) and
declared below so planning marks them before GPU time is spent:
- forward: fp16/bf16, head dims 64/96/128 on sm90, GQA; uniform blocks of 64 or 128 only (the grid
  is fixed: `block_sizes` trims a block's tail, it cannot move block boundaries, so the variable
  block layout has no exact form here);
- backward: bf16, MHA only, head dim 128 on sm90.
Anything else the library refuses at run time becomes the row's `unsupported` reason, in its words.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from longca.kernels.base import Capabilities, Prepared, Unsupported, block_layout, sync
from longca.kernels.registry import register
from longca.masks.blocks import BlockLayout
from longca.masks.mask import Mask

PACKAGE = "cudnn.block_sparse_attention"
BLOCK_SIZES = frozenset({64, 128})
# what the library's validation raises for a shape it refuses
REFUSALS = (ValueError, NotImplementedError, RuntimeError)


def block_index_form(layout: BlockLayout, heads_q: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept KV block ids of every (query head, query block), ascending, as cuDNN takes them.

    Returns (index, counts): index (heads_q, n_q_blocks, max_kept) int32, padded past each row's
    count with its last kept id (never read: counts say how many are valid); counts (heads_q,
    n_q_blocks) int32. Query head h reads KV head h // (heads_q // heads_kv), as in GQA.
    """
    if heads_q % layout.heads:
        raise ValueError(f"heads_q={heads_q} is not a multiple of the layout's {layout.heads} KV heads")
    kept = np.repeat(np.asarray(layout.kept, dtype=bool), heads_q // layout.heads, axis=0)
    counts = kept.sum(axis=-1)
    if counts.min() < 1:
        raise ValueError("every query block must keep at least one key block")
    width = int(counts.max())
    # ids of kept blocks first (stable sort of ~kept keeps them ascending), then pad with the last kept id
    order = np.argsort(~kept, axis=-1, kind="stable")[..., :width]
    last = np.take_along_axis(order, (counts - 1)[..., None], axis=-1)
    index = np.where(np.arange(width) < counts[..., None], order, last)
    return index.astype(np.int32), counts.astype(np.int32)


def _refused(exc: Exception) -> Unsupported:
    return Unsupported(f"cuDNN block-sparse attention: {type(exc).__name__}: {exc}"[:500])


def _library(fn_name: str, *args, **kwargs):
    """Call one of the library's functions; its argument validation's refusals become Unsupported."""
    import cudnn.block_sparse_attention as bsa

    try:
        return getattr(bsa, fn_name)(*args, **kwargs)
    except REFUSALS as exc:
        if _is_validation(exc):
            raise _refused(exc) from None
        raise


def _is_validation(exc: Exception) -> bool:
    """Raised by the library's argument validation (cudnn/block_sparse_attention/api.py), not by a
    kernel (those stay errors)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(
        "block_sparse_attention/api.py"
    )


class _BlockSparse(torch.autograd.Function):
    """Forward keeps (out, lse) for the library's explicit backward. `counts` None: every query
    block keeps the same number of key blocks (the library's fixed-count kernels)."""

    @staticmethod
    def forward(ctx, q, k, v, index, counts, block):  # type: ignore[override]
        res = _library(
            "block_sparse_attention_forward",
            q,
            k,
            v,
            index,
            q2k_block_nums=counts,
            sparse_block_size=block,
            layout="bhsd",
            pack_gqa=False,  # metadata per query head on every architecture (sm100 would pack GQA)
        )
        out, lse = res["o_tensor"], res["lse_tensor"]
        ctx.save_for_backward(q, k, v, out, lse, index, counts)
        ctx.block = block
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse, index, counts = ctx.saved_tensors
        res = _library(
            "block_sparse_attention_backward",
            dout.contiguous(),
            q,
            k,
            v,
            out,
            lse,
            index,
            q2k_block_nums=counts,
            sparse_block_size=ctx.block,
            layout="bhsd",
        )
        return res["dq_tensor"], res["dk_tensor"], res["dv_tensor"], None, None, None


class CudnnBlockSparse:
    name = "cudnn_block_sparse"
    layout = "bhsd"
    description = "cuDNN block-sparse attention (cudnn.block_sparse_attention), kept-block lists on a 64/128 grid"
    caps = Capabilities(
        mask_forms=frozenset({"block_sparse"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({64, 96, 128}),
        gqa=True,
        backward=True,
        backward_dtypes=frozenset({"bfloat16"}),
        backward_head_dims=frozenset({128}),
        backward_gqa=False,
        min_compute_capability=(9, 0),
        package=PACKAGE,
        block_sizes=BLOCK_SIZES,
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
        layout = block_layout(self, mask, form, heads_q, heads_kv)
        block = int(layout.uniform_block)
        t0 = time.perf_counter()
        index, counts = block_index_form(layout, heads_q)
        # one layout per cell, shared by the batch (as for every mask)
        index_t = torch.from_numpy(index).to(device)[None].expand(batch, -1, -1, -1).contiguous()
        fixed = bool((counts == counts.flat[0]).all())
        counts_t = None if fixed else torch.from_numpy(counts).to(device)[None].expand(batch, -1, -1).contiguous()
        sync(device)
        build_s = time.perf_counter() - t0

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return _BlockSparse.apply(q, k, v, index_t, counts_t, block)

        kept = f"kept={index.shape[-1]}" if fixed else f"kept<={index.shape[-1]} (variable count)"
        info = {"backend": f"cudnn block-sparse blk{block} {kept}", "uniform_block": block}
        return Prepared(call=call, layout=self.layout, build_s=build_s, info=info)


register(CudnnBlockSparse())

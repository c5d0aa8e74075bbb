"""Block-sparse FlashAttention-2 (MIT Han Lab's Block-Sparse-Attention, package `block_sparse_attn`).

Shapes: q (B, S, Hq, D), k/v (B, S, Hkv, D) -> out (B, S, Hq, D). The call packs the batch as the
package's varlen layout ((B*S, H, D), `cu_seqlens` of B equal sequences, no copy) and marks every head
block-sparse (`head_mask_type` 1) with `base_blockmask` (B, Hq, S/128, S/128): the kernel's tile is
fixed at 128 x 128, so only uniform 128-token layouts run. Its block mask is per query head; under
GQA the mask's per-KV-head layout is repeated per group and K/V heads are repeated to Hq for the
call (their gradients summed back by autograd), because grouped heads are not documented for the
block-sparse path. Forward and backward (the package's autograd Function).

This is the paper's "block-sparse FlashAttention-2". The package is source-only (a CUDA build),
so the project's H200 host does not have it and its cells there are `unsupported:
block_sparse_attn not installed`; where it is installed every cell is checked against the float32
reference before it is timed, like any kernel's.
"""

from __future__ import annotations

import time

import torch

from longca.kernels.base import Capabilities, Prepared, Unsupported, block_layout, sync
from longca.kernels.registry import register
from longca.masks.mask import Mask

BLOCK = 128  # the package's fixed m_block_dim / n_block_dim


class BlockSparseFA2:
    name = "block_sparse_fa2"
    layout = "bshd"
    description = "MIT Han Lab block-sparse FlashAttention-2 (block_sparse_attn; 128-token blocks, fwd+bwd)"
    caps = Capabilities(
        mask_forms=frozenset({"block_sparse"}),
        dtypes=frozenset({"bfloat16", "float16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({64, 128}),
        gqa=True,  # by repeating K/V heads (see the module docstring)
        backward=True,
        min_compute_capability=(8, 0),
        package="block_sparse_attn",
        block_sizes=frozenset({BLOCK}),
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
        if mask.seqlen_k != mask.seqlen_q:
            raise Unsupported(f"self-attention only (S {mask.seqlen_q}x{mask.seqlen_k})")
        try:
            from block_sparse_attn import block_sparse_attn_func
        except ImportError as exc:
            raise Unsupported(f"block_sparse_attn not installed ({exc})") from exc

        device = torch.device(device)
        group = heads_q // heads_kv
        s = mask.seqlen_q
        t0 = time.perf_counter()
        per_query_head = torch.from_numpy(layout.kept).to(device).repeat_interleave(group, dim=0)
        base_blockmask = per_query_head[None].expand(batch, -1, -1, -1).contiguous()
        head_mask_type = torch.ones(heads_q, dtype=torch.int32, device=device)
        cu_seqlens = torch.arange(0, (batch + 1) * s, s, dtype=torch.int32, device=device)
        sync(device)
        build_s = time.perf_counter() - t0

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if group > 1:
                k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
            out = block_sparse_attn_func(
                q.reshape(batch * s, heads_q, head_dim),
                k.reshape(batch * s, heads_q, head_dim),
                v.reshape(batch * s, heads_q, head_dim),
                cu_seqlens,
                cu_seqlens,
                head_mask_type,
                None,
                base_blockmask,
                s,
                s,
                0.0,
                softmax_scale=head_dim**-0.5,
                is_causal=False,
            )
            return out.reshape(batch, s, heads_q, head_dim)

        backend = "block_sparse_attn, block 128" + (f", K/V repeated x{group}" if group > 1 else "")
        return Prepared(call=call, layout=self.layout, build_s=build_s, info={"backend": backend})


register(BlockSparseFA2())

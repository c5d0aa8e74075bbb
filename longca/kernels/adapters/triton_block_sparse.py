"""longca's own Triton block-sparse attention (longca.kernels.triton_sparse).

Takes the mask's BlockLayout (uniform or variable blocks, per-KV-head kept lists) as CSR index
tables built in prepare() (timed as build_s); Triton compiles on the first call (the warm-up).
Forward and backward; GQA by indexing the KV head inside the kernels (no K/V repeat). fp8 (e4m3)
runs the same forward kernels on e4m3 q, k, v (output e4m3, softmax statistics in float32); the
backward takes 16-bit inputs only.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import torch

from longca.kernels.base import Capabilities, Prepared, RankCapabilities, Unsupported, sync
from longca.kernels.lse import Part
from longca.kernels.rank import NO_SLICES, RankKernel, SubMask, acc_dtype, check_heads, gqa_groups, layout_area
from longca.kernels.registry import register
from longca.masks.blocks import BlockLayout
from longca.masks.mask import Mask


# ------------------------------------------------------------------ its per-rank form (context parallelism)
class RankTritonBlockSparse(RankKernel):
    """longca's Triton block-sparse kernel (longca.kernels.triton_sparse) over the step's block
    lists: the forward visits only the kept blocks of the KV shard held and returns the LSE; the
    backward takes the global (out, LSE), which the kernel's backward accepts as given (so each
    step's gradient is its exact share). GQA inside the kernel (no K/V repeat). Index tables are
    built from the step's BlockLayout on first use per head dim (the warm-up call), cached in the
    SubMask. Block-sparse masks only. On CPU only under Triton's interpreter (TRITON_INTERPRET=1)."""

    name = "triton_block_sparse"
    takes_blocks = True

    def prepare_check(self, slices: np.ndarray) -> None:
        raise Unsupported(
            "per-rank kernel 'triton_block_sparse' takes block-sparse masks (block_sparse, "
            "variable_block_sparse), not slice masks (use flex or sdpa_cudnn)"
        )

    def prepare(self, slices, seqlen_q, seqlen_k, device):
        self.prepare_check(slices)

    def prepare_blocks(self, layout: BlockLayout, heads_q: int, device: torch.device) -> SubMask:
        import os

        if torch.device(device).type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise Unsupported(
                "per-rank kernel 'triton_block_sparse' runs on CUDA, or on CPU only under "
                "Triton's interpreter (TRITON_INTERPRET=1 set before triton is imported)"
            )
        return SubMask(NO_SLICES, int(layout.q_bounds[-1]), int(layout.k_bounds[-1]), layout_area(layout), {}, layout)

    def __init__(self) -> None:
        self.tiles: set[str] = set()  # the tile configs this instance's plans ran with

    def backend_detail(self) -> str | None:
        """'triton tiles <config>' as single-GPU rows name it (configs of several steps joined by ' | '),
        so a CP row can be compared with single-GPU rows of the same tiles."""
        return "triton tiles " + " | ".join(sorted(self.tiles)) if self.tiles else None

    def _plan(self, sub: SubMask, q: torch.Tensor):
        key = (q.shape[-1], str(q.device))
        if key not in sub.form:
            from longca.kernels.triton_sparse.configs import default_config
            from longca.kernels.triton_sparse.plan import build_plan

            sub.form[key] = build_plan(sub.blocks, q.device, default_config(q.shape[-1], sub.blocks.uniform_block))
        self.tiles.add(sub.form[key].config.as_text())
        return sub.form[key]

    def fwd_parts(self, q, k, v, sub) -> list:
        """All rows as one part, out in the inputs' dtype (no float32 copy before the combination)."""
        from longca.kernels.triton_sparse.api import block_sparse_attn_fwd

        check_heads(sub, k)
        gqa_groups(q, k)
        out, lse = block_sparse_attn_fwd(q, k, v, self._plan(sub, q))
        return [Part(out, lse.to(acc_dtype(q.dtype)), 0, q.shape[2])]

    def fwd(self, q, k, v, sub):
        ((out, lse, _, _),) = self.fwd_parts(q, k, v, sub)
        return out.to(acc_dtype(q.dtype)), lse

    def bwd(self, dout, q, k, v, out, lse, sub):
        from longca.kernels.triton_sparse.api import block_sparse_attn_bwd

        check_heads(sub, k)
        a = acc_dtype(q.dtype)
        grads = block_sparse_attn_bwd(
            q, k, v, out.to(q.dtype).contiguous(), lse.float().contiguous(), dout.to(q.dtype), self._plan(sub, q)
        )
        return tuple(g.to(a) for g in grads)


class TritonBlockSparse:
    name = "triton_block_sparse"
    layout = "bhsd"
    description = "longca Triton block-sparse attention (FA2-style fwd+bwd, CSR block lists, GQA)"
    caps = Capabilities(
        mask_forms=frozenset({"block_sparse"}),
        dtypes=frozenset({"bfloat16", "float16", "float8_e4m3fn"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({64, 128, 256}),
        gqa=True,
        backward=True,
        backward_dtypes=frozenset({"bfloat16", "float16"}),
        min_compute_capability=(8, 0),
        package="triton",
        cp=RankCapabilities(
            devices=frozenset({"cpu", "cuda"}),
            dtypes=frozenset({"float32", "bfloat16", "float16"}),
            slice_kinds=frozenset(),
            block_sparse=RankTritonBlockSparse.takes_blocks,
            note="block-sparse masks only; CPU only under TRITON_INTERPRET=1",
        ),
    )

    def rank_kernel(self) -> RankTritonBlockSparse:
        return RankTritonBlockSparse()

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
        config=None,
    ) -> Prepared:
        from longca.kernels.triton_sparse.api import block_sparse_attention
        from longca.kernels.triton_sparse.configs import default_config
        from longca.kernels.triton_sparse.plan import build_plan

        if form != "block_sparse":
            raise ValueError(f"{self.name} takes the block_sparse form, not {form!r}")
        if mask.blocks is None:
            raise ValueError(f"mask {mask.name!r} carries no BlockLayout")
        if mask.blocks.heads != heads_kv or heads_q % heads_kv:
            raise ValueError(f"mask has {mask.blocks.heads} KV heads; cell has {heads_q}:{heads_kv}")
        device = torch.device(device)
        t0 = time.perf_counter()
        config = config or default_config(head_dim, mask.blocks.uniform_block)
        if dtype.itemsize == 1 and config.fwd_kernel != "ptr":
            # Triton 3.6 fails to compile the TMA forwards for e4m3 on the H200 ("PassManager::run
            # failed" at the TMA kernel); the pointer kernel compiles and checks correct
            config = replace(config, fwd_kernel="ptr")
        plan = build_plan(mask.blocks, device, config)
        sync(device)
        build_s = time.perf_counter() - t0

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return block_sparse_attention(q, k, v, plan)

        # The tiles that ran (after shrinking to divide the block) go into the row's `backend`, so
        # rows measured under different tile configs stay distinguishable.
        info = {
            "backend": f"triton tiles {plan.config.as_text()}",
            "uniform_block": mask.blocks.uniform_block,
            "fast_path": plan.fast_path,
        }
        return Prepared(call=call, layout=self.layout, build_s=build_s, info=info)


register(TritonBlockSparse())

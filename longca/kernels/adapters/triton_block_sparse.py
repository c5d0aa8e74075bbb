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

import torch

from longca.kernels import rank
from longca.kernels.base import Capabilities, Prepared, RankCapabilities, sync
from longca.kernels.registry import register
from longca.masks.mask import Mask


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
            block_sparse=rank.TritonBlockSparse.takes_blocks,
            note="block-sparse masks only; CPU only under TRITON_INTERPRET=1",
        ),
    )

    def rank_kernel(self) -> rank.TritonBlockSparse:
        return rank.TritonBlockSparse()

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

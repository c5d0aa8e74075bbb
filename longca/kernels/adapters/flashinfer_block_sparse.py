"""FlashInfer's variable block-sparse attention (`flashinfer.sparse.VariableBlockSparseAttentionWrapper`).

Shapes: q (1, Hq, S, D), k/v (1, Hkv, S, D) -> out (1, Hq, S, D); FlashInfer's HND layout is the
batch-free view of these (the wrapper plans one sequence, so batch 1 only). GQA natively: query
head h reads KV head h // (Hq / Hkv). Forward only (FlashInfer has no backward for it).

The mask's per-KV-head BlockLayout maps one to one onto the wrapper's plan: `block_mask_map`
(Hkv, query blocks, key blocks), `block_row_sz` (Hkv, query blocks) and `block_col_sz` (Hkv, key
blocks) token counts, so uniform and variable blocks both run; `plan` (host-side scheduling) is
timed as the mask build. This is the paper's "FlashInfer variable block-sparse wrapper".

Not measured by the project yet: FlashInfer is about 150 MiB with its dependencies and compiles its
kernels at run time, which the H200 host (no network, no compiler cache) cannot take, so there its
cells are `unsupported: flashinfer not installed`. Where FlashInfer is installed, every cell's
output is checked against the float32 reference before it is timed, like any kernel's.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from longca.kernels.base import Capabilities, Prepared, Unsupported, block_layout, sync
from longca.kernels.registry import register
from longca.masks.mask import Mask

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's documented example size


class FlashInferBlockSparse:
    name = "flashinfer_block_sparse"
    layout = "bhsd"
    description = "FlashInfer VariableBlockSparseAttentionWrapper (any block sizes per KV head, GQA, forward only)"
    caps = Capabilities(
        mask_forms=frozenset({"block_sparse"}),
        dtypes=frozenset({"bfloat16", "float16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({64, 128, 256}),
        gqa=True,
        backward=False,
        min_compute_capability=(8, 0),
        package="flashinfer",
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
        if batch != 1:
            raise Unsupported(f"the wrapper plans one sequence: batch 1 only, cell has {batch}")
        try:
            import flashinfer.sparse
        except ImportError as exc:
            raise Unsupported(f"flashinfer not installed ({exc})") from exc

        device = torch.device(device)
        t0 = time.perf_counter()
        rows = np.diff(layout.q_bounds).astype(np.int32)
        cols = np.diff(layout.k_bounds).astype(np.int32)
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        wrapper = flashinfer.sparse.VariableBlockSparseAttentionWrapper(workspace)
        wrapper.plan(
            block_mask_map=torch.from_numpy(layout.kept),
            block_row_sz=torch.from_numpy(np.tile(rows, (heads_kv, 1))),
            block_col_sz=torch.from_numpy(np.tile(cols, (heads_kv, 1))),
            num_qo_heads=heads_q,
            num_kv_heads=heads_kv,
            head_dim=head_dim,
            q_data_type=dtype,
            kv_data_type=dtype,
        )
        sync(device)
        build_s = time.perf_counter() - t0

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return wrapper.run(q[0], k[0], v[0])[None]

        version = getattr(flashinfer, "__version__", "?")
        return Prepared(
            call=call,
            layout=self.layout,
            build_s=build_s,
            info={"backend": f"flashinfer {version} VariableBlockSparseAttentionWrapper"},
            extra={"workspace": workspace},
        )


register(FlashInferBlockSparse())

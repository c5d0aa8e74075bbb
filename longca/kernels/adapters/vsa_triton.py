"""VSA's Triton block-sparse attention (the `vsa` package: FastVideo's Video Sparse Attention).

Shapes: q, k, v (B, H, S, D) with one head count (VSA has no GQA) -> out (B, H, S, D); S a multiple
of 64. Uniform 64-token blocks only: VSA's tile is 64 x 64 and its index tables count 64-token
blocks. The mask's per-head BlockLayout becomes VSA's block map (B, H, S/64, S/64) and its
query-to-key and key-to-query index tables (`vsa.index.map_to_index`), built in prepare.

The LongCA-bench paper measured this kernel (its "Triton port of VSA") beside VSA's ThunderKittens
kernel. The package's own import path does not reach it on Hopper: `vsa/__init__.py` imports the
ThunderKittens extension `vsa_cuda` whenever the GPU is sm90, and that extension cannot load on the
project's H200 (it wants libcudart.so.12 and another torch build; ../shared/reference/h200.md).
So the adapter loads the package's two pure-Triton files as modules of their own
(`vsa/block_sparse_attn_triton.py`, `vsa/index.py`), which need nothing from `vsa_cuda`, and wraps
VSA's forward and backward launchers in an autograd Function (the package's own wrapper module
imports through `vsa/__init__.py`).
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from longca.kernels.base import Capabilities, Prepared, Unsupported, block_layout, sync
from longca.kernels.registry import register
from longca.masks.mask import Mask

BLOCK = 64  # VSA's tile; its index tables count 64-token blocks


def vsa_modules() -> tuple[ModuleType, ModuleType]:
    """(block_sparse_attn_triton, index) of the installed `vsa` package, loaded as files so that
    `vsa/__init__.py` (and with it `vsa_cuda`) is never imported."""
    loaded = sys.modules.get("longca_vsa_triton"), sys.modules.get("longca_vsa_index")
    if all(loaded):
        return loaded  # type: ignore[return-value]
    spec = importlib.util.find_spec("vsa")  # locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise Unsupported("vsa not installed")
    root = Path(list(spec.submodule_search_locations)[0])
    modules = []
    for name, file in (("longca_vsa_triton", "block_sparse_attn_triton.py"), ("longca_vsa_index", "index.py")):
        file_spec = importlib.util.spec_from_file_location(name, root / file)
        if file_spec is None or file_spec.loader is None or not (root / file).is_file():
            raise Unsupported(f"vsa package at {root.name} has no {file}")
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
        sys.modules[name] = module
        modules.append(module)
    return modules[0], modules[1]


def block_pointers_removed() -> str | None:
    """Why this Triton cannot compile VSA's kernel, or None: the kernel is written with
    `tl.make_block_ptr`, which Triton removed in 2026 in favour of tensor descriptors (the function
    is still there and raises; the project's H200 runs Triton 3.6, which has it)."""
    import triton
    import triton.language as tl

    fn = getattr(tl, "make_block_ptr", None)
    if fn is None or "have been removed" in (fn.__doc__ or ""):
        return f"VSA's Triton kernel uses block pointers, which Triton {triton.__version__} has removed"
    return None


class _VsaAttention(torch.autograd.Function):
    """VSA's Triton forward and backward launchers; the tables are VSA's (index, count) pairs."""

    @staticmethod
    def forward(ctx, q, k, v, tables):  # type: ignore[override]
        kernels, (q2k_index, q2k_num, k2q_index, k2q_num, sizes) = tables
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = kernels.triton_block_sparse_attn_forward(q, k, v, q2k_index, q2k_num, sizes)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.tables = tables
        return out

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        kernels, (q2k_index, q2k_num, k2q_index, k2q_num, sizes) = ctx.tables
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = kernels.triton_block_sparse_attn_backward(
            dout.contiguous(), q, k, v, out, lse, q2k_index, q2k_num, k2q_index, k2q_num, sizes
        )
        return dq, dk, dv, None


class VsaTriton:
    name = "vsa_triton"
    layout = "bhsd"
    description = "VSA's Triton block-sparse attention (vsa package; 64-token blocks, no GQA, fwd+bwd)"
    caps = Capabilities(
        mask_forms=frozenset({"block_sparse"}),
        dtypes=frozenset({"bfloat16", "float16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({64, 128}),
        gqa=False,
        backward=True,
        min_compute_capability=(8, 0),
        package="vsa",
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
        if mask.seqlen_q % BLOCK or mask.seqlen_k != mask.seqlen_q:
            raise Unsupported(f"VSA takes S a multiple of {BLOCK} (S {mask.seqlen_q}x{mask.seqlen_k})")
        kernels, index = vsa_modules()
        refusal = block_pointers_removed()
        if refusal:
            raise Unsupported(refusal)
        device = torch.device(device)
        t0 = time.perf_counter()
        block_map = torch.from_numpy(layout.kept).to(device)[None].expand(batch, -1, -1, -1).contiguous()
        q2k_index, q2k_num = index.map_to_index(block_map.int())
        k2q_index, k2q_num = index.map_to_index(block_map.transpose(-1, -2).contiguous().int())
        sizes = torch.full((layout.kept.shape[1],), BLOCK, dtype=torch.int32, device=device)
        sync(device)
        build_s = time.perf_counter() - t0
        tables = (kernels, (q2k_index, q2k_num, k2q_index, k2q_num, sizes))

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return _VsaAttention.apply(q, k, v, tables)

        return Prepared(
            call=call,
            layout=self.layout,
            build_s=build_s,
            info={"backend": "vsa triton (vsa/block_sparse_attn_triton.py), block 64"},
        )


register(VsaTriton())

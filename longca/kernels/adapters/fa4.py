"""FlashAttention-4 (package `flash-attn-4`, module `flash_attn.cute`: CuTe DSL, JIT-compiled).

Shapes (layout bshd, every form): q (B, S, Hq, D), k/v (B, S, Hkv, D) -> out (B, S, Hq, D). In the
varlen form the call views them as (B*S, H, D) packed documents (no copy) with int32 cu_seqlens
over the documents of every batch element. GQA natively. Both functions return (out, lse); the
adapter keeps out.

Masks (checked against 4.0.0b36's interface.py):
- full, causal (causal=True), sliding windows (window_size=(left, right), None = unbounded);
- full/causal documents: flash_attn_varlen_func(cu_seqlens_q/k, max_seqlen_q/k, causal);
- every other static mask ("slices" form): a CuTe `mask_mod` that reads per-query key intervals
  (longca.masks.flex.row_intervals) from an aux tensor, plus block sparsity from the same
  BlockMask flex uses (128 x 128 blocks: empty blocks skipped, full blocks unmasked), forward
  and backward. Block sparsity is used for head dims <= 128 only: on sm90 the forward tile for
  head dim 256 is 128 x 80 and FA4 requires the sparse KV block to be a multiple of the tile.
  Without block sparsity the mask_mod runs on every block (correct, but full-attention cost).
Runs on sm90 (H100/H200) and sm100; head dims 8..256 on sm90 (multiples of 8), <= 128 or 256 on
sm100. fp16/bf16 (fp8 is forward-only on sm100 and not used). The first call of each
configuration compiles (about 1-3 s on the H200): the cell's first warm-up call measures it (compile_s).
"""

from __future__ import annotations

import functools

import torch

from longca.kernels.adapters._flash_args import FlashAdapter, FlashMaskArgs, first_output, interval_table
from longca.kernels.base import Capabilities, Unsupported
from longca.kernels.registry import register
from longca.masks.mask import Mask

BLOCK = 128  # block sparsity grid (the sm90 forward tile for head dims <= 128)
BLOCK_SPARSE_MAX_HEAD_DIM = 128


@functools.cache
def interval_mask_mod(layers: int):
    """CuTe mask_mod: aux_tensors[0] is the flat int32 table of longca's interval_table:
    query q attends key k iff table[2 (q L + j)] <= k < table[2 (q L + j) + 1] for some j < L."""
    import cutlass
    import cutlass.cute as cute
    from flash_attn.cute import utils

    width = 2 * layers

    @cute.jit
    def mask_mod(batch, head, m_idx, n_idx, seqlen_info, aux_tensors):
        table = aux_tensors[0]
        row = m_idx[0] * width
        lo = utils.scalar_to_ssa(table[row], cutlass.Int32)
        hi = utils.scalar_to_ssa(table[row + 1], cutlass.Int32)
        allowed = (n_idx >= lo) & (n_idx < hi)
        for j in cutlass.range_constexpr(layers - 1):
            lo_j = utils.scalar_to_ssa(table[row + 2 * (j + 1)], cutlass.Int32)
            hi_j = utils.scalar_to_ssa(table[row + 2 * (j + 1) + 1], cutlass.Int32)
            allowed = allowed | ((n_idx >= lo_j) & (n_idx < hi_j))
        return allowed

    return mask_mod


def block_sparse_tensors(mask: Mask, device):
    """(forward, backward) BlockSparseTensorsTorch from longca's BlockMask of the mask.

    Forward: per query block, the partial and full key blocks; backward: per key block, the
    partial and full query blocks (the BlockMask's q_* tensors)."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch

    from longca.masks.flex import to_block_mask

    bm = to_block_mask(mask, block_size=BLOCK, device=device)
    fwd = BlockSparseTensorsTorch(
        mask_block_cnt=bm.kv_num_blocks,
        mask_block_idx=bm.kv_indices,
        full_block_cnt=bm.full_kv_num_blocks,
        full_block_idx=bm.full_kv_indices,
        block_size=(BLOCK, BLOCK),
    )
    bwd = BlockSparseTensorsTorch(
        mask_block_cnt=bm.q_num_blocks,
        mask_block_idx=bm.q_indices,
        full_block_cnt=bm.full_q_num_blocks,
        full_block_idx=bm.full_q_indices,
        block_size=(BLOCK, BLOCK),
    )
    return fwd, bwd, int(bm.kv_num_blocks.sum()), int(bm.full_kv_num_blocks.sum())


class FlashAttention4(FlashAdapter):
    name = "fa4"
    description = "FlashAttention-4 (flash_attn.cute, CuTe DSL): flags, varlen, or mask_mod + block sparsity"
    caps = Capabilities(
        mask_forms=frozenset({"full", "causal", "window", "varlen", "slices"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({64, 96, 128, 192, 256}),
        gqa=True,
        backward=True,
        min_compute_capability=(9, 0),
        package="flash_attn.cute",
    )
    use_block_sparsity = True

    def functions(self):
        """(flash_attn_func, flash_attn_varlen_func) of flash_attn.cute."""
        from flash_attn.cute import flash_attn_func, flash_attn_varlen_func

        return flash_attn_func, flash_attn_varlen_func

    def dense_call(self, funcs, args: FlashMaskArgs, mask: Mask, device):
        func = funcs[0]
        causal = args.causal
        window = (None, None) if causal else args.window_or_none()

        def call(q, k, v):
            return first_output(func(q, k, v, causal=causal, window_size=window))

        return call

    def varlen_call(self, funcs, args: FlashMaskArgs, device):
        func = funcs[1]
        cu = torch.as_tensor(args.cu_seqlens, dtype=torch.int32, device=device)
        m, causal = args.max_seqlen, args.causal

        def call(q, k, v):
            return first_output(
                func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=m, max_seqlen_k=m, causal=causal)
            )

        return call

    def extra_call(self, funcs, mask: Mask, form: str, *, heads_q: int, head_dim: int, device):
        """The "slices" form: interval mask_mod (+ block sparsity for head dims <= 128)."""
        if form != "slices":
            raise Unsupported(f"fa4 takes no {form!r} form")
        if mask.per_head:
            raise Unsupported("fa4: per-KV-head masks are not wired (use their block_sparse form elsewhere)")
        func = funcs[0]
        table, layers = interval_table(mask)
        aux = [torch.as_tensor(table, device=device)]
        mask_mod = interval_mask_mod(layers)
        kwargs = {"mask_mod": mask_mod, "aux_tensors": aux}
        info = {"mask_mod_layers": layers, "block_sparse": False}
        if self.use_block_sparsity and head_dim <= BLOCK_SPARSE_MAX_HEAD_DIM:
            fwd, bwd, partial, full = block_sparse_tensors(mask, device)
            kwargs.update(block_sparse_tensors=fwd, block_sparse_tensors_bwd=bwd)
            info.update(block_sparse=True, block_size=BLOCK, blocks_partial=partial, blocks_full=full)

        def call(q, k, v):
            return first_output(func(q, k, v, **kwargs))

        return call, info


register(FlashAttention4())

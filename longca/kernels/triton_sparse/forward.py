"""Block-sparse attention forward: FlashAttention-2 online softmax over the kept key blocks.

One program per (query tile, batch x query head). It walks the CSR row of its query block (the
kept key blocks of its KV head) tile by tile, keeps a running max and sum in base 2 (the softmax
scale times log2(e) folded into one multiply), accumulates in fp32 and writes the output and the
row log-sum-exp (natural log; -inf for a row with no kept block, whose output is 0).

Two kernels share the softmax step: the pointer kernel (every layout) and, opt-in through
KernelConfig.fwd_kernel, a tensor-descriptor kernel for uniform blocks and whole query tiles whose
Q/K/V tile loads and O store are TMA copies on sm90+, optionally with Triton's automatic warp
specialization of the key loop ("tma_ws").
"""

from __future__ import annotations

import contextvars
import math

import torch
import triton
import triton.language as tl

from longca.kernels.triton_sparse.plan import SparsePlan

LOG2E = 1.4426950408889634


@triton.jit
def _softmax_step(acc, l_i, m_i, qk, v, qk_scale):
    """Fold one tile's scores qk (BLOCK_M, BLOCK_N) and values v into the running max, sum and acc."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.math.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _query_tile(heads_q, group, tile_start, tile_block):
    """This program's (batch, query head, KV head, first query row, query block) from its ids."""
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    m0 = tl.load(tile_start + tl.program_id(0))
    qblk = tl.load(tile_block + tl.program_id(0))
    return b, h, h // group, m0, qblk


@triton.jit
def _fwd_start(row_ptr, row, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Empty running max, sum and accumulator, and the CSR range [lo, hi) of this query block's row."""
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    return m_i, l_i, acc, tl.load(row_ptr + row), tl.load(row_ptr + row + 1)


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, k_ptrs, v_ptrs, n0, k_hi, offs_n, stride_kn, stride_vn, qk_scale, MASK_K: tl.constexpr):
    """One BLOCK_N key tile starting at row n0 (keys >= k_hi masked when MASK_K)."""
    if MASK_K:
        valid = (n0 + offs_n) < k_hi
        k = tl.load(k_ptrs + tl.cast(n0, tl.int64) * stride_kn, mask=valid[None, :], other=0.0)
        v = tl.load(v_ptrs + tl.cast(n0, tl.int64) * stride_vn, mask=valid[:, None], other=0.0)
    else:
        k = tl.load(k_ptrs + tl.cast(n0, tl.int64) * stride_kn)
        v = tl.load(v_ptrs + tl.cast(n0, tl.int64) * stride_vn)
    qk = tl.dot(q, k)
    if MASK_K:
        qk = tl.where(valid[None, :], qk, float("-inf"))
    return _softmax_step(acc, l_i, m_i, qk, v, qk_scale)


@triton.jit
def _fwd_finish(acc, l_i, m_i):
    """Normalized output and natural-log LSE (0 and -inf for a row that saw no key)."""
    empty = l_i == 0.0
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    return acc, lse


@triton.jit
def _fwd_kernel(
    Q,
    K,
    V,
    Out,
    Lse,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_ob,
    stride_oh,
    stride_os,
    tile_start,
    tile_end,
    tile_block,
    row_ptr,
    row_idx,
    k_bounds,
    heads_q,
    group,
    n_q_blocks,
    seqlen_q,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_BLOCK: tl.constexpr,
    EVEN_M: tl.constexpr,
):
    b, h, hk, m0, qblk = _query_tile(heads_q, group, tile_start, tile_block)
    pid_bh = tl.program_id(1)
    m_hi = tl.load(tile_end + tl.program_id(0))
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    q_ptrs = Q + offs_m[:, None].to(tl.int64) * stride_qs + offs_d[None, :]
    k_ptrs = K + offs_n[None, :].to(tl.int64) * stride_ks + offs_d[:, None]  # (D, BLOCK_N): K^T
    v_ptrs = V + offs_n[:, None].to(tl.int64) * stride_vs + offs_d[None, :]
    row_ok = offs_m < m_hi
    if EVEN_M:
        q = tl.load(q_ptrs)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    m_i, l_i, acc, lo, hi = _fwd_start(row_ptr, hk * n_q_blocks + qblk, BLOCK_M, HEAD_DIM)
    if K_BLOCK > 0:
        # Uniform key blocks: one flat loop over (kept block, tile) pairs, no masks.
        for it in range(lo * (K_BLOCK // BLOCK_N), hi * (K_BLOCK // BLOCK_N)):
            kblk = tl.load(row_idx + it // (K_BLOCK // BLOCK_N))
            n0 = kblk * K_BLOCK + (it % (K_BLOCK // BLOCK_N)) * BLOCK_N
            acc, l_i, m_i = _fwd_tile(
                acc, l_i, m_i, q, k_ptrs, v_ptrs, n0, 0, offs_n, stride_ks, stride_vs, qk_scale, False
            )
    else:
        # Variable key blocks: each block is a run of tiles, the last one ragged.
        for p in range(lo, hi):
            kblk = tl.load(row_idx + p)
            k_lo = tl.load(k_bounds + kblk)
            k_hi = tl.load(k_bounds + kblk + 1)
            for n0 in range(k_lo, k_hi, BLOCK_N):
                acc, l_i, m_i = _fwd_tile(
                    acc, l_i, m_i, q, k_ptrs, v_ptrs, n0, k_hi, offs_n, stride_ks, stride_vs, qk_scale, True
                )
    acc, lse = _fwd_finish(acc, l_i, m_i)
    o_ptrs = (
        Out
        + b.to(tl.int64) * stride_ob
        + h.to(tl.int64) * stride_oh
        + offs_m[:, None].to(tl.int64) * stride_os
        + offs_d[None, :]
    )
    lse_ptrs = Lse + pid_bh.to(tl.int64) * seqlen_q + offs_m
    if EVEN_M:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty))
        tl.store(lse_ptrs, lse)
    else:
        tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=row_ok[:, None])
        tl.store(lse_ptrs, lse, mask=row_ok)


@triton.jit
def _fwd_tma_kernel(
    Q,
    K,
    V,
    Out,
    Lse,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_ob,
    stride_oh,
    stride_os,
    tile_start,
    tile_block,
    row_ptr,
    row_idx,
    heads_q,
    group,
    n_q_blocks,
    seqlen_q,
    seqlen_k,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    K_BLOCK: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """_fwd_kernel's uniform-block path (K_BLOCK > 0, whole query tiles) on tensor descriptors."""
    b, h, hk, m0, qblk = _query_tile(heads_q, group, tile_start, tile_block)
    pid_bh = tl.program_id(1)
    # One 2-D (seqlen, head_dim) descriptor per (batch, head), built on the device from the strides:
    # any bhsd view with 16-byte aligned rows works (forward.uses_tma checks), and Triton 3.6 warp-
    # specializes attention on Hopper only with device-side descriptors (triton-lang/triton#7658).
    desc_q = tl.make_tensor_descriptor(
        Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh,
        [seqlen_q, HEAD_DIM],
        [stride_qs, 1],
        [BLOCK_M, HEAD_DIM],
    )
    desc_k = tl.make_tensor_descriptor(
        K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh,
        [seqlen_k, HEAD_DIM],
        [stride_ks, 1],
        [BLOCK_N, HEAD_DIM],
    )
    desc_v = tl.make_tensor_descriptor(
        V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh,
        [seqlen_k, HEAD_DIM],
        [stride_vs, 1],
        [BLOCK_N, HEAD_DIM],
    )
    desc_o = tl.make_tensor_descriptor(
        Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh,
        [seqlen_q, HEAD_DIM],
        [stride_os, 1],
        [BLOCK_M, HEAD_DIM],
    )
    q = desc_q.load([m0, 0])
    m_i, l_i, acc, lo, hi = _fwd_start(row_ptr, hk * n_q_blocks + qblk, BLOCK_M, HEAD_DIM)
    TILES: tl.constexpr = K_BLOCK // BLOCK_N
    for it in tl.range(lo * TILES, hi * TILES, warp_specialize=WARP_SPECIALIZE):
        kblk = tl.load(row_idx + it // TILES)
        n0 = kblk * K_BLOCK + (it % TILES) * BLOCK_N
        k = desc_k.load([n0, 0])
        v = desc_v.load([n0, 0])
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, tl.dot(q, k.T), v, qk_scale)
    acc, lse = _fwd_finish(acc, l_i, m_i)
    desc_o.store([m0, 0], acc.to(Out.dtype.element_ty))
    tl.store(Lse + pid_bh.to(tl.int64) * seqlen_q + m0 + tl.arange(0, BLOCK_M), lse)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SparsePlan) -> tuple[int, int, int, int]:
    """Validate (batch, heads, seqlen, head_dim) inputs against the plan; returns (B, Hq, Hkv, D)."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"expected bhsd q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    if (sq, sk) != (plan.seqlen_q, plan.seqlen_k):
        raise ValueError(f"sequence lengths {(sq, sk)} differ from the plan's {(plan.seqlen_q, plan.seqlen_k)}")
    if hkv != plan.heads_kv or hq % hkv:
        raise ValueError(f"heads {hq}:{hkv} do not fit the plan's {plan.heads_kv} KV heads")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    for t in (q, k, v):
        if t.stride(-1) != 1:
            raise ValueError("the last dimension must be contiguous")
    return b, hq, hkv, d


def k_block_constexpr(plan: SparsePlan, block_n: int) -> int:
    """K_BLOCK for the kernels: the uniform key block size when tiles divide it, else 0."""
    return plan.uniform_k if plan.uniform_k and plan.uniform_k % block_n == 0 else 0


def uses_tma(plan: SparsePlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """True when forward() runs the tensor-descriptor kernel: the plan asks for it, key blocks are
    uniform multiples of the tile, query tiles are whole, and q, k and v have 16-byte aligned bases
    and batch/head/row strides, as TMA requires (the output is a fresh allocation with q's strides,
    so it is aligned whenever q is)."""
    if plan.config.fwd_kernel == "ptr" or not k_block_constexpr(plan, plan.config.fwd.block_n) or not plan.fwd_q.even:
        return False
    return all(
        t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:3]) for t in (q, k, v)
    )


def forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: SparsePlan, sm_scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse attention of bhsd q, k, v; returns (out bhsd, lse (B, Hq, Sq) float32)."""
    b, hq, hkv, d = check_inputs(q, k, v, plan)
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    out = torch.empty_like(q)
    lse = torch.empty((b, hq, plan.seqlen_q), device=q.device, dtype=torch.float32)
    cfg, tiles = plan.config.fwd, plan.fwd_q
    grid = (tiles.count, b * hq)
    if uses_tma(plan, q, k, v):

        def launch() -> None:
            # Device-side descriptors need global scratch (128 bytes per program) from an allocator,
            # set in a copied context so that it does not leak into the caller's.
            triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=q.device))
            _fwd_tma_kernel[grid](
                q,
                k,
                v,
                out,
                lse,
                q.stride(0),
                q.stride(1),
                q.stride(2),
                k.stride(0),
                k.stride(1),
                k.stride(2),
                v.stride(0),
                v.stride(1),
                v.stride(2),
                out.stride(0),
                out.stride(1),
                out.stride(2),
                tiles.start,
                tiles.block,
                plan.rows.ptr,
                plan.rows.idx,
                hq,
                hq // hkv,
                plan.n_q_blocks,
                plan.seqlen_q,
                plan.seqlen_k,
                sm_scale * LOG2E,
                HEAD_DIM=d,
                BLOCK_M=cfg.block_m,
                BLOCK_N=cfg.block_n,
                K_BLOCK=k_block_constexpr(plan, cfg.block_n),
                WARP_SPECIALIZE=plan.config.fwd_kernel == "tma_ws",
                num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )

        contextvars.copy_context().run(launch)
        return out, lse
    _fwd_kernel[grid](
        q,
        k,
        v,
        out,
        lse,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        tiles.start,
        tiles.end,
        tiles.block,
        plan.rows.ptr,
        plan.rows.idx,
        plan.k_bounds,
        hq,
        hq // hkv,
        plan.n_q_blocks,
        plan.seqlen_q,
        sm_scale * LOG2E,
        HEAD_DIM=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        K_BLOCK=k_block_constexpr(plan, cfg.block_n),
        EVEN_M=tiles.even,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return out, lse

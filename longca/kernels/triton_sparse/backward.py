"""Block-sparse attention backward (FlashAttention-2 style, three kernels, no atomics).

- _delta_kernel: D = rowsum(dO * O) in fp32 (the softmax-gradient correction term).
- _dkdv_kernel: one program per (key tile, batch x KV head) holds dK, dV in registers and walks
  the transposed CSR (the kept query blocks of its key block) for every query head of its GQA
  group, so GQA needs no reduction afterwards.
- _dq_kernel: one program per (query tile, batch x query head) walks the forward's CSR row.
P is recomputed from the saved LSE, so `backward` accepts any (out, lse) pair: that of this
kernel's own forward, or a merged one from several ring-attention steps (each step's backward
then yields its exact share of the gradients).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from longca.kernels.triton_sparse.forward import LOG2E, _query_tile, check_inputs, k_block_constexpr
from longca.kernels.triton_sparse.plan import SparsePlan


@triton.jit
def _delta_kernel(
    Out,
    DOut,
    Delta,
    stride_ob,
    stride_oh,
    stride_os,
    stride_db,
    stride_dh,
    stride_ds,
    heads_q,
    seqlen_q,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_q
    h = pid_bh % heads_q
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    ok = offs_m < seqlen_q
    o = tl.load(
        Out
        + b.to(tl.int64) * stride_ob
        + h.to(tl.int64) * stride_oh
        + offs_m[:, None].to(tl.int64) * stride_os
        + offs_d[None, :],
        mask=ok[:, None],
        other=0.0,
    )
    do = tl.load(
        DOut
        + b.to(tl.int64) * stride_db
        + h.to(tl.int64) * stride_dh
        + offs_m[:, None].to(tl.int64) * stride_ds
        + offs_d[None, :],
        mask=ok[:, None],
        other=0.0,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + pid_bh.to(tl.int64) * seqlen_q + offs_m, delta, mask=ok)


@triton.jit
def _dkdv_tile(
    dk,
    dv,
    k,
    v,
    q_ptrs,
    do_ptrs,
    lse_ptrs,
    delta_ptrs,
    m0,
    m_hi,
    offs_m,
    stride_qs,
    stride_ds,
    qk_scale,
    MASK_M: tl.constexpr,
):
    """Add one BLOCK_M query tile's contribution (rows m0.., < m_hi when MASK_M) to dK, dV."""
    if MASK_M:
        valid = (m0 + offs_m) < m_hi
        qT = tl.load(q_ptrs + tl.cast(m0, tl.int64) * stride_qs, mask=valid[None, :], other=0.0)  # (D, BLOCK_M)
        do = tl.load(do_ptrs + tl.cast(m0, tl.int64) * stride_ds, mask=valid[:, None], other=0.0)  # (BLOCK_M, D)
        lse2 = tl.load(lse_ptrs + m0, mask=valid, other=float("inf"))  # inf: P = 0 on padding
        delta = tl.load(delta_ptrs + m0, mask=valid, other=0.0)
    else:
        qT = tl.load(q_ptrs + tl.cast(m0, tl.int64) * stride_qs)
        do = tl.load(do_ptrs + tl.cast(m0, tl.int64) * stride_ds)
        lse2 = tl.load(lse_ptrs + m0)
        delta = tl.load(delta_ptrs + m0)
    pT = tl.math.exp2(tl.dot(k, qT) * qk_scale - lse2[None, :])  # (BLOCK_N, BLOCK_M)
    dv = tl.dot(pT.to(do.dtype), do, dv)
    dpT = tl.dot(v, tl.trans(do))
    dsT = pT * (dpT - delta[None, :])
    dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk)
    return dk, dv


@triton.jit
def _dkdv_kernel(
    Q,
    K,
    V,
    DOut,
    Lse2,
    Delta,
    DK,
    DV,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_db,
    stride_dh,
    stride_ds,
    stride_dkb,
    stride_dkh,
    stride_dks,
    stride_dvb,
    stride_dvh,
    stride_dvs,
    tile_start,
    tile_end,
    tile_block,
    col_ptr,
    col_idx,
    q_bounds,
    heads_q,
    heads_kv,
    group,
    n_k_blocks,
    seqlen_q,
    qk_scale,
    sm_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    Q_BLOCK: tl.constexpr,
    EVEN_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // heads_kv
    hk = pid_bh % heads_kv
    n0 = tl.load(tile_start + pid_n)
    n_hi = tl.load(tile_end + pid_n)
    kblk = tl.load(tile_block + pid_n)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < n_hi
    k_ptrs = (
        K
        + b.to(tl.int64) * stride_kb
        + hk.to(tl.int64) * stride_kh
        + offs_n[:, None].to(tl.int64) * stride_ks
        + offs_d[None, :]
    )
    v_ptrs = (
        V
        + b.to(tl.int64) * stride_vb
        + hk.to(tl.int64) * stride_vh
        + offs_n[:, None].to(tl.int64) * stride_vs
        + offs_d[None, :]
    )
    if EVEN_N:
        k = tl.load(k_ptrs)
        v = tl.load(v_ptrs)
    else:
        k = tl.load(k_ptrs, mask=col_ok[:, None], other=0.0)
        v = tl.load(v_ptrs, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    col = hk * n_k_blocks + kblk
    lo = tl.load(col_ptr + col)
    hi = tl.load(col_ptr + col + 1)
    for g in range(group):
        h = hk * group + g
        bh = b * heads_q + h
        q_ptrs = (
            Q
            + b.to(tl.int64) * stride_qb
            + h.to(tl.int64) * stride_qh
            + offs_m[None, :].to(tl.int64) * stride_qs
            + offs_d[:, None]
        )  # (D, BLOCK_M): Q^T
        do_ptrs = (
            DOut
            + b.to(tl.int64) * stride_db
            + h.to(tl.int64) * stride_dh
            + offs_m[:, None].to(tl.int64) * stride_ds
            + offs_d[None, :]
        )
        lse_ptrs = Lse2 + bh.to(tl.int64) * seqlen_q + offs_m
        delta_ptrs = Delta + bh.to(tl.int64) * seqlen_q + offs_m
        if Q_BLOCK > 0:
            for it in range(lo * (Q_BLOCK // BLOCK_M), hi * (Q_BLOCK // BLOCK_M)):
                qblk = tl.load(col_idx + it // (Q_BLOCK // BLOCK_M))
                m0 = qblk * Q_BLOCK + (it % (Q_BLOCK // BLOCK_M)) * BLOCK_M
                dk, dv = _dkdv_tile(
                    dk,
                    dv,
                    k,
                    v,
                    q_ptrs,
                    do_ptrs,
                    lse_ptrs,
                    delta_ptrs,
                    m0,
                    0,
                    offs_m,
                    stride_qs,
                    stride_ds,
                    qk_scale,
                    False,
                )
        else:
            for p in range(lo, hi):
                qblk = tl.load(col_idx + p)
                m_lo = tl.load(q_bounds + qblk)
                m_hi = tl.load(q_bounds + qblk + 1)
                for m0 in range(m_lo, m_hi, BLOCK_M):
                    dk, dv = _dkdv_tile(
                        dk,
                        dv,
                        k,
                        v,
                        q_ptrs,
                        do_ptrs,
                        lse_ptrs,
                        delta_ptrs,
                        m0,
                        m_hi,
                        offs_m,
                        stride_qs,
                        stride_ds,
                        qk_scale,
                        True,
                    )
    dk *= sm_scale
    dk_ptrs = (
        DK
        + b.to(tl.int64) * stride_dkb
        + hk.to(tl.int64) * stride_dkh
        + offs_n[:, None].to(tl.int64) * stride_dks
        + offs_d[None, :]
    )
    dv_ptrs = (
        DV
        + b.to(tl.int64) * stride_dvb
        + hk.to(tl.int64) * stride_dvh
        + offs_n[:, None].to(tl.int64) * stride_dvs
        + offs_d[None, :]
    )
    if EVEN_N:
        tl.store(dk_ptrs, dk.to(DK.dtype.element_ty))
        tl.store(dv_ptrs, dv.to(DV.dtype.element_ty))
    else:
        tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
        tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _dq_tile(
    dq, q, do, lse2, delta, k_ptrs, v_ptrs, n0, k_hi, offs_n, stride_ks, stride_vs, qk_scale, MASK_K: tl.constexpr
):
    """Add one BLOCK_N key tile's contribution (keys n0.., < k_hi when MASK_K) to dQ."""
    if MASK_K:
        valid = (n0 + offs_n) < k_hi
        kT = tl.load(k_ptrs + tl.cast(n0, tl.int64) * stride_ks, mask=valid[None, :], other=0.0)  # (D, BLOCK_N)
        vT = tl.load(v_ptrs + tl.cast(n0, tl.int64) * stride_vs, mask=valid[None, :], other=0.0)
    else:
        kT = tl.load(k_ptrs + tl.cast(n0, tl.int64) * stride_ks)
        vT = tl.load(v_ptrs + tl.cast(n0, tl.int64) * stride_vs)
    qk = tl.dot(q, kT) * qk_scale
    if MASK_K:
        qk = tl.where(valid[None, :], qk, float("-inf"))
    p = tl.math.exp2(qk - lse2[:, None])
    dp = tl.dot(do, vT)
    ds = p * (dp - delta[:, None])
    dq = tl.dot(ds.to(kT.dtype), tl.trans(kT), dq)
    return dq


@triton.jit
def _dq_kernel(
    Q,
    K,
    V,
    DOut,
    Lse2,
    Delta,
    DQ,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_db,
    stride_dh,
    stride_ds,
    stride_dqb,
    stride_dqh,
    stride_dqs,
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
    sm_scale,
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
    row_ok = offs_m < m_hi
    q_ptrs = (
        Q
        + b.to(tl.int64) * stride_qb
        + h.to(tl.int64) * stride_qh
        + offs_m[:, None].to(tl.int64) * stride_qs
        + offs_d[None, :]
    )
    do_ptrs = (
        DOut
        + b.to(tl.int64) * stride_db
        + h.to(tl.int64) * stride_dh
        + offs_m[:, None].to(tl.int64) * stride_ds
        + offs_d[None, :]
    )
    k_ptrs = (
        K
        + b.to(tl.int64) * stride_kb
        + hk.to(tl.int64) * stride_kh
        + offs_n[None, :].to(tl.int64) * stride_ks
        + offs_d[:, None]
    )
    v_ptrs = (
        V
        + b.to(tl.int64) * stride_vb
        + hk.to(tl.int64) * stride_vh
        + offs_n[None, :].to(tl.int64) * stride_vs
        + offs_d[:, None]
    )
    stat = pid_bh.to(tl.int64) * seqlen_q + offs_m
    if EVEN_M:
        q = tl.load(q_ptrs)
        do = tl.load(do_ptrs)
        lse2 = tl.load(Lse2 + stat)
        delta = tl.load(Delta + stat)
    else:
        q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
        do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
        lse2 = tl.load(Lse2 + stat, mask=row_ok, other=float("inf"))
        delta = tl.load(Delta + stat, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    row = hk * n_q_blocks + qblk
    lo = tl.load(row_ptr + row)
    hi = tl.load(row_ptr + row + 1)
    if K_BLOCK > 0:
        for it in range(lo * (K_BLOCK // BLOCK_N), hi * (K_BLOCK // BLOCK_N)):
            kblk = tl.load(row_idx + it // (K_BLOCK // BLOCK_N))
            n0 = kblk * K_BLOCK + (it % (K_BLOCK // BLOCK_N)) * BLOCK_N
            dq = _dq_tile(dq, q, do, lse2, delta, k_ptrs, v_ptrs, n0, 0, offs_n, stride_ks, stride_vs, qk_scale, False)
    else:
        for p in range(lo, hi):
            kblk = tl.load(row_idx + p)
            k_lo = tl.load(k_bounds + kblk)
            k_hi = tl.load(k_bounds + kblk + 1)
            for n0 in range(k_lo, k_hi, BLOCK_N):
                dq = _dq_tile(
                    dq, q, do, lse2, delta, k_ptrs, v_ptrs, n0, k_hi, offs_n, stride_ks, stride_vs, qk_scale, True
                )
    dq *= sm_scale
    dq_ptrs = (
        DQ
        + b.to(tl.int64) * stride_dqb
        + h.to(tl.int64) * stride_dqh
        + offs_m[:, None].to(tl.int64) * stride_dqs
        + offs_d[None, :]
    )
    if EVEN_M:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty))
    else:
        tl.store(dq_ptrs, dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])


def backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    plan: SparsePlan,
    sm_scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of block-sparse attention given the output and its LSE (B, Hq, Sq).

    Rows whose LSE is -inf (no kept block) get dq = 0 and add nothing to dk, dv."""
    b, hq, hkv, d = check_inputs(q, k, v, plan)
    if out.shape != q.shape or dout.shape != q.shape or lse.shape != (b, hq, plan.seqlen_q):
        raise ValueError("out, dout must match q and lse must be (B, Hq, Sq)")
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    qk_scale = sm_scale * LOG2E
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    sq = plan.seqlen_q
    delta = torch.empty((b, hq, sq), device=q.device, dtype=torch.float32)
    _delta_kernel[(triton.cdiv(sq, 64), b * hq)](
        out,
        dout,
        delta,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        dout.stride(0),
        dout.stride(1),
        dout.stride(2),
        hq,
        sq,
        HEAD_DIM=d,
        BLOCK_M=64,
    )
    lse2 = (lse.float() * LOG2E).contiguous()  # base-2 LSE, as the kernels' exponent uses
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    qs, ks, vs, ds = q.stride(), k.stride(), v.stride(), dout.stride()

    cfg, tiles = plan.config.dkdv, plan.dkdv_k
    q_block = plan.uniform_q if plan.uniform_q and plan.uniform_q % cfg.block_m == 0 else 0
    _dkdv_kernel[(tiles.count, b * hkv)](
        q,
        k,
        v,
        dout,
        lse2,
        delta,
        dk,
        dv,
        *qs[:3],
        *ks[:3],
        *vs[:3],
        *ds[:3],
        *dk.stride()[:3],
        *dv.stride()[:3],
        tiles.start,
        tiles.end,
        tiles.block,
        plan.cols.ptr,
        plan.cols.idx,
        plan.q_bounds,
        hq,
        hkv,
        hq // hkv,
        plan.n_k_blocks,
        sq,
        qk_scale,
        sm_scale,
        HEAD_DIM=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        Q_BLOCK=q_block,
        EVEN_N=tiles.even,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )

    cfg, tiles = plan.config.dq, plan.dq_q
    _dq_kernel[(tiles.count, b * hq)](
        q,
        k,
        v,
        dout,
        lse2,
        delta,
        dq,
        *qs[:3],
        *ks[:3],
        *vs[:3],
        *ds[:3],
        *dq.stride()[:3],
        tiles.start,
        tiles.end,
        tiles.block,
        plan.rows.ptr,
        plan.rows.idx,
        plan.k_bounds,
        hq,
        hq // hkv,
        plan.n_q_blocks,
        sq,
        qk_scale,
        sm_scale,
        HEAD_DIM=d,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        K_BLOCK=k_block_constexpr(plan, cfg.block_n),
        EVEN_M=tiles.even,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    return dq, dk, dv

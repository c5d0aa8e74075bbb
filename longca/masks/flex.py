"""FlexAttention BlockMask built from the slices, block by block, never materialising S x S.

torch's `create_block_mask` evaluates mask_mod on every (q, k) pair (or an S x S tensor), which
is what made the LongCA-bench paper drop FlexAttention from long sweeps. Here:

1. `block_states` classifies every (query block, key block) as empty, partial or full, exactly:
   blocks strictly inside one slice are full (found per slice and block row, as intervals); only
   blocks on slice edges and diagonals get an exact pair count (closed form,
   slices.area_in_rect), summed over slices. Cost ~ (number of blocks) + (boundary blocks); memory
   one int8 per block pair (16 MB at S = 512K, block 128).
2. The BlockMask's kv and q index tensors come from that grid without sorting.
3. The mask_mod, only called inside partial blocks, evaluates the slices on-device from per-query
   key intervals: K layers of (lo, hi) int32 vectors of length S, where K is the most slices
   sharing one query row (2 for the whole catalogue), so `lo_j[q] <= k < hi_j[q]` for some j.

Block-sparse masks (per KV head) are classified from their block layout, and their mask_mod looks
up the kept flag of (head, query block, key block).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import numpy as np
import torch

from longca.masks import slices as sl
from longca.masks.block_sparse import uniform_bounds
from longca.masks.blocks import BlockLayout
from longca.masks.mask import Mask

EMPTY, PARTIAL, FULL = 0, 1, 2


def _pairs_per_block_row(slices: np.ndarray, bq: int) -> tuple[np.ndarray, np.ndarray]:
    """(slice index, query block index) for every block row each slice touches."""
    first = slices[:, 0] // bq
    last = (slices[:, 1] - 1) // bq
    counts = last - first + 1
    sidx = np.repeat(np.arange(len(slices)), counts)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return sidx, first[sidx] + (np.arange(len(sidx)) - offsets)


def _expand_ranges(start: np.ndarray, stop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ranges [start_i, stop_i): (range index, value) of every element."""
    n = np.maximum(stop - start, 0)
    ridx = np.repeat(np.arange(len(n)), n)
    offsets = np.repeat(np.cumsum(n) - n, n)
    return ridx, start[ridx] + (np.arange(len(ridx)) - offsets)


def _block_pieces(s: np.ndarray, seqlen_q: int, seqlen_k: int, bq: int, bk: int):
    """Blocks fully inside one slice, as per-block-row intervals (row, first, stop), and the
    exact pair counts of every other touched block (linear index i * nk + j, count)."""
    nk = -(-seqlen_k // bk)
    sidx, qb = _pairs_per_block_row(s, bq)
    rows = s[sidx]
    ra = np.maximum(rows[:, 0], qb * bq)  # first row of the slice inside this block row
    rb = np.minimum(rows[:, 1], (qb + 1) * bq)  # one past the last
    lo_first, hi_first = sl.key_bounds(rows, ra)
    lo_last, hi_last = sl.key_bounds(rows, rb - 1)
    # Key blocks touched by any row of the pair (bounds are monotone in q, so first/last suffice).
    t_lo = lo_first // bk
    t_hi = np.where(hi_last > lo_first, -(-hi_last // bk), t_lo)
    # Key blocks every row of the whole block row attends: full by this slice alone.
    whole_rows = (ra == qb * bq) & (rb == np.minimum((qb + 1) * bq, seqlen_q))
    f_lo = -(-lo_last // bk)
    f_hi = np.where(hi_first >= seqlen_k, nk, hi_first // bk)
    interior = whole_rows & (f_hi > f_lo) & (hi_first > lo_last)
    f_lo = np.where(interior, np.clip(f_lo, t_lo, t_hi), t_lo)
    f_hi = np.where(interior, np.clip(f_hi, t_lo, t_hi), t_lo)
    # Boundary candidates: touched but not interior; their exact counts decide.
    p1, j1 = _expand_ranges(t_lo, f_lo)
    p2, j2 = _expand_ranges(f_hi, t_hi)
    pair = np.concatenate([p1, p2])
    j = np.concatenate([j1, j2])
    i = qb[pair]
    counts = sl.area_in_rect(rows[pair], i * bq, (i + 1) * bq, j * bk, (j + 1) * bk)
    lin, inv = np.unique(i * nk + j, return_inverse=True)
    total = np.bincount(inv.ravel(), weights=counts, minlength=len(lin)).astype(np.int64)
    return (qb[interior], f_lo[interior], f_hi[interior]), (lin, total)


def _block_areas(lin: np.ndarray, seqlen_q: int, seqlen_k: int, bq: int, bk: int) -> np.ndarray:
    nk = -(-seqlen_k // bk)
    bi, bj = lin // nk, lin % nk
    return (np.minimum((bi + 1) * bq, seqlen_q) - bi * bq) * (np.minimum((bj + 1) * bk, seqlen_k) - bj * bk)


def block_states(
    slices: np.ndarray, seqlen_q: int, seqlen_k: int, block_q: int = 128, block_k: int = 128
) -> np.ndarray:
    """int8 (n_q_blocks, n_k_blocks): EMPTY, PARTIAL or FULL, exact (ragged last blocks included)."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    nq, nk = -(-seqlen_q // block_q), -(-seqlen_k // block_k)
    states = np.zeros((nq, nk), dtype=np.int8)
    if not len(s):
        return states
    (i, f_lo, f_hi), (lin, total) = _block_pieces(s, seqlen_q, seqlen_k, block_q, block_k)
    if len(i):
        diff = np.zeros((nq, nk + 1), dtype=np.int8)  # interval starts +1, stops -1, then cumsum
        np.add.at(diff, (i, f_lo), 1)
        np.add.at(diff, (i, f_hi), -1)
        states[np.cumsum(diff, axis=1, dtype=np.int8)[:, :nk] > 0] = FULL
        del diff
    if len(lin):
        area = _block_areas(lin, seqlen_q, seqlen_k, block_q, block_k)
        st = np.where(total == area, FULL, np.where(total > 0, PARTIAL, EMPTY)).astype(np.int8)
        flat = states.reshape(-1)
        flat[lin] = np.maximum(flat[lin], st)  # a block inside one slice is touched by no other
    return states


def block_counts(slices: np.ndarray, seqlen_q: int, seqlen_k: int, block_q: int, block_k: int) -> np.ndarray:
    """int64 (n_q_blocks, n_k_blocks): exact attended pairs per block (for pictures and CP)."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    nq, nk = -(-seqlen_q // block_q), -(-seqlen_k // block_k)
    counts = np.zeros(nq * nk, dtype=np.int64)
    if not len(s):
        return counts.reshape(nq, nk)
    (i, f_lo, f_hi), (lin, total) = _block_pieces(s, seqlen_q, seqlen_k, block_q, block_k)
    ri, rj = _expand_ranges(f_lo, f_hi)
    full_lin = i[ri] * nk + rj
    counts[full_lin] = _block_areas(full_lin, seqlen_q, seqlen_k, block_q, block_k)
    counts[lin] += total
    return counts.reshape(nq, nk)


def layout_block_counts(layout: BlockLayout, block_q: int = 128, block_k: int = 128) -> np.ndarray:
    """int64 (heads, n_q_blocks, n_k_blocks): exact kept pairs of a block layout per grid block."""
    sq, sk = int(layout.q_bounds[-1]), int(layout.k_bounds[-1])

    def overlaps(bounds: np.ndarray, seqlen: int, block: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        # grid block i overlaps layout blocks first[i] .. last[i]; the d-th of them by ov[d][i] tokens
        starts = np.arange(0, seqlen, block, dtype=np.int64)
        ends = np.minimum(starts + block, seqlen)
        first = np.searchsorted(bounds, starts, side="right") - 1
        last = np.searchsorted(bounds, ends - 1, side="right") - 1
        idx, ov = [], []
        for d in range(int((last - first).max()) + 1):
            a = np.minimum(first + d, len(bounds) - 2)
            o = np.minimum(ends, bounds[a + 1]) - np.maximum(starts, bounds[a])
            idx.append(a)
            ov.append(np.where(first + d <= last, np.maximum(o, 0), 0))
        return idx, ov

    qi, qo = overlaps(layout.q_bounds, sq, block_q)
    ki, ko = overlaps(layout.k_bounds, sk, block_k)
    out = np.zeros((layout.heads, len(qi[0]), len(ki[0])), dtype=np.int64)
    for h in range(layout.heads):
        kept = layout.kept[h]
        for a, oa in zip(qi, qo):
            for b, ob in zip(ki, ko):
                out[h] += kept[a[:, None], b[None, :]] * (oa[:, None] * ob[None, :])
    return out


def layout_block_states(layout: BlockLayout, block_q: int = 128, block_k: int = 128) -> np.ndarray:
    """int8 (heads, n_q_blocks, n_k_blocks) states of a block-sparse layout on a (block_q, block_k) grid."""
    sq, sk = int(layout.q_bounds[-1]), int(layout.k_bounds[-1])
    if np.array_equal(layout.q_bounds, uniform_bounds(sq, block_q)) and np.array_equal(
        layout.k_bounds, uniform_bounds(sk, block_k)
    ):
        # The grid is the layout's own: a kept block is a FULL grid block, the rest EMPTY (no counting).
        return np.where(layout.kept, np.int8(FULL), np.int8(EMPTY))
    count = layout_block_counts(layout, block_q, block_k)
    nq, nk = count.shape[1:]
    area = (np.minimum(np.arange(1, nq + 1) * block_q, sq) - np.arange(nq) * block_q)[:, None] * (
        np.minimum(np.arange(1, nk + 1) * block_k, sk) - np.arange(nk) * block_k
    )[None, :]
    return np.where(count == area, FULL, np.where(count > 0, PARTIAL, EMPTY)).astype(np.int8)


def _ordered(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (H, R, C) -> (count (H, R) int32, column indices (H, R, C) int32).

    The first `count` entries of a row are its True columns, ascending (what torch's
    argsort-based conversion gives, without sorting); later entries are valid but unspecified
    column indices (never read). A row is 0..C-1 rotated to start at its first True column
    (a row copy from a sliding window view); rows with several runs of True columns then get
    their True columns written explicitly (work proportional to them). No sort."""
    h, r, c = grid.shape
    num = np.count_nonzero(grid, axis=-1).astype(np.int32)
    idx = np.empty((h, r, c), dtype=np.int32)
    cols = np.arange(c, dtype=np.int32)
    rotations = np.lib.stride_tricks.sliding_window_view(np.concatenate([cols, cols]), c)  # row f: f, f+1, ..
    for hh in range(h):
        g, out = grid[hh], idx[hh]
        edge = np.empty_like(g)
        edge[:, 0] = g[:, 0]
        np.greater(g[:, 1:], g[:, :-1], out=edge[:, 1:])  # True after False: a run begins
        first = np.argmax(edge, axis=1)  # 0 for rows without runs
        for i, f in enumerate(first.tolist()):  # row i = f, f + 1, ... (mod c): a row copy, no temporaries
            out[i] = rotations[f]
        multi = np.nonzero(np.count_nonzero(edge, axis=1) > 1)[0]
        if len(multi):  # rows with several runs: write their True columns explicitly
            row, s_col = np.nonzero(edge[multi])
            sub = g[multi]
            edge = np.empty_like(sub)
            edge[:, -1] = sub[:, -1]
            np.greater(sub[:, :-1], sub[:, 1:], out=edge[:, :-1])  # True before False: a run ends
            _, e_col = np.nonzero(edge)
            length = e_col - s_col + 1
            before = np.cumsum(length) - length  # True columns in earlier runs, all rows
            run = np.repeat(np.arange(len(length)), length)
            within = np.arange(int(length.sum())) - before[run]
            pos = (before - before[np.searchsorted(row, row)])[run] + within  # position in its row
            out[multi[row[run]], pos] = s_col[run] + within
        del edge
    return num, idx


def row_intervals(slices: np.ndarray, seqlen_q: int, pad_to: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per-query key intervals: lo, hi of shape (K, rows) int32, rows = seqlen_q rounded up to
    pad_to; query q attends k iff lo[j, q] <= k < hi[j, q] for some layer j. Slices are put in
    layers greedily so that slices of one layer never share a query row."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    rows = -(-seqlen_q // pad_to) * pad_to
    order = np.argsort(s[:, 0], kind="stable")
    layer_of = np.zeros(len(s), dtype=np.int64)
    free: list[tuple[int, int]] = []  # (row where the layer becomes free, layer)
    n_layers = 0
    for i in order:
        q0, q1 = int(s[i, 0]), int(s[i, 1])
        if free and free[0][0] <= q0:
            _, layer = heapq.heappop(free)
        else:
            layer, n_layers = n_layers, n_layers + 1
        layer_of[i] = layer
        heapq.heappush(free, (q1, layer))
    lo = np.zeros((max(n_layers, 1), rows), dtype=np.int32)
    hi = np.zeros((max(n_layers, 1), rows), dtype=np.int32)
    for layer in range(n_layers):
        part = s[layer_of == layer]
        sidx, q = _expand_ranges(part[:, 0], part[:, 1])
        a, b = sl.key_bounds(part[sidx], q)
        lo[layer, q] = a
        hi[layer, q] = b
    return lo, hi


MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def mask_mod_from_slices(
    slices: np.ndarray, seqlen_q: int, seqlen_k: int, device: str | torch.device = "cpu", pad_to: int = 128
) -> MaskMod:
    """A FlexAttention mask_mod (b, h, q_idx, kv_idx) -> bool that evaluates the slices on-device.

    Memory: 2 x K x S int32 (K = most slices sharing a query row). Query indices up to seqlen_q
    rounded up to pad_to are valid (padded rows attend nothing)."""
    lo, hi = row_intervals(slices, seqlen_q, pad_to)
    los = [torch.as_tensor(x, device=device) for x in lo]
    his = [torch.as_tensor(x, device=device) for x in hi]
    n = len(los)

    def with_buffers(b, h, q_idx, kv_idx, *bufs):
        allowed = (kv_idx >= bufs[0][q_idx]) & (kv_idx < bufs[n][q_idx])
        for j in range(1, n):
            allowed = allowed | ((kv_idx >= bufs[j][q_idx]) & (kv_idx < bufs[n + j][q_idx]))
        return allowed

    # The same test as with_buffers, on the captured tensors: the compiled forward (dynamo) shares
    # one kernel across masks of one shape only while mask_mod reads tensors, not another function.
    def mask_mod(b, h, q_idx, kv_idx):
        allowed = (kv_idx >= los[0][q_idx]) & (kv_idx < his[0][q_idx])
        for lo_j, hi_j in zip(los[1:], his[1:]):
            allowed = allowed | ((kv_idx >= lo_j[q_idx]) & (kv_idx < hi_j[q_idx]))
        return allowed

    mask_mod.layers = n  # type: ignore[attr-defined]
    return _explicit(mask_mod, with_buffers, (*los, *his))


def mask_mod_from_layout(
    layout: BlockLayout, device: str | torch.device = "cpu", heads_q: int | None = None, pad_to: int = 128
) -> MaskMod:
    """mask_mod for a block-sparse layout: kept[h_kv, query block of q, key block of k].

    With heads_q, the h argument is a query head and maps to KV head h // (heads_q / heads_kv)."""
    sq, sk = int(layout.q_bounds[-1]), int(layout.k_bounds[-1])

    def block_of(bounds: np.ndarray, seqlen: int) -> torch.Tensor:
        n = -(-seqlen // pad_to) * pad_to
        ids = np.searchsorted(bounds, np.minimum(np.arange(n), seqlen - 1), side="right") - 1
        return torch.as_tensor(ids.astype(np.int32), device=device)

    qblk, kblk = block_of(layout.q_bounds, sq), block_of(layout.k_bounds, sk)
    kept = torch.as_tensor(layout.kept, device=device)
    group = 1 if heads_q is None else _group(heads_q, layout.heads)

    def with_buffers(b, h, q_idx, kv_idx, kept_, qblk_, kblk_):
        return kept_[h // group, qblk_[q_idx], kblk_[kv_idx]] & (kv_idx < sk)

    def mask_mod(b, h, q_idx, kv_idx):  # as with_buffers (see mask_mod_from_slices)
        return kept[h // group, qblk[q_idx], kblk[kv_idx]] & (kv_idx < sk)

    return _explicit(mask_mod, with_buffers, (kept, qblk, kblk))


def _explicit(mask_mod: MaskMod, with_buffers: Callable, buffers: tuple[torch.Tensor, ...]) -> MaskMod:
    """Attach the tensors a mask_mod reads, and the same function taking them as arguments
    (`with_buffers(b, h, q_idx, kv_idx, *buffers)`): a graph traced outside dynamo (the CP Flex
    backward, longca.kernels.flex_backward) must receive them as inputs, not as captured constants."""
    mask_mod.buffers = buffers  # type: ignore[attr-defined]
    mask_mod.with_buffers = with_buffers  # type: ignore[attr-defined]
    return mask_mod


def _group(heads_q: int, heads_kv: int) -> int:
    if heads_q % heads_kv:
        raise ValueError(f"heads_q={heads_q} is not a multiple of the mask's KV heads {heads_kv}")
    return heads_q // heads_kv


def mask_states(mask: Mask, block_size: int | tuple[int, int] = 128) -> np.ndarray:
    """int8 (heads, n_q_blocks, n_k_blocks) block states of any mask (heads = 1 unless per head)."""
    bq, bk = (block_size, block_size) if isinstance(block_size, int) else block_size
    if mask.blocks is not None:
        return layout_block_states(mask.blocks, bq, bk)
    return np.stack(
        [block_states(mask.slices_of_head(h), mask.seqlen_q, mask.seqlen_k, bq, bk) for h in range(mask.heads)]
    )


def to_block_mask(
    mask: Mask,
    block_size: int | tuple[int, int] = 128,
    device: str | torch.device = "cpu",
    heads_q: int | None = None,
    backward: bool = True,
):
    """The FlexAttention BlockMask of a mask: full blocks skip mask_mod, partial blocks call it.

    Shared masks get a heads dimension of 1 (broadcast). Per-head (block-sparse) masks get one
    entry per KV head, or per query head when heads_q is given (needed for GQA: FlexAttention
    indexes the BlockMask by query head). Without `backward` the query-direction index tensors,
    which only the backward reads, are left out: at 512K on a 64 grid with 64 query heads they are
    32 GiB (torch's compute_q_blocks=False)."""
    from torch.nn.attention.flex_attention import BlockMask

    bq, bk = (block_size, block_size) if isinstance(block_size, int) else block_size
    states = mask_states(mask, (bq, bk))
    # Per-KV-head states are ordered once per KV head and repeated per query head afterwards (on
    # the device): ordering the 64 query heads' copies cost 8x the time (35 s of 36 at 256K, GQA 64:8).
    group = _group(heads_q, states.shape[0]) if mask.per_head and heads_q is not None else 1
    if mask.blocks is not None:
        mod = mask_mod_from_layout(mask.blocks, device, heads_q, pad_to=max(bq, bk))
    elif mask.head_slices is not None:
        raise ValueError("to_block_mask: per-head slice masks are not supported; use a block layout")
    else:
        mod = mask_mod_from_slices(mask.slices, mask.seqlen_q, mask.seqlen_k, device, pad_to=max(bq, bk))

    kv_num, kv_idx = _index_tensors(states == PARTIAL, group, device)
    fkv_num, fkv_idx = _index_tensors(states == FULL, group, device)
    q_num = q_idx = fq_num = fq_idx = None
    if backward:
        states = _transposed(states)  # (heads, key blocks, query blocks): the q-direction tensors
        q_num, q_idx = _index_tensors(states == PARTIAL, group, device)
        fq_num, fq_idx = _index_tensors(states == FULL, group, device)
    return BlockMask(
        seq_lengths=(mask.seqlen_q, mask.seqlen_k),
        kv_num_blocks=kv_num,
        kv_indices=kv_idx,
        full_kv_num_blocks=fkv_num,
        full_kv_indices=fkv_idx,
        q_num_blocks=q_num,
        q_indices=q_idx,
        full_q_num_blocks=fq_num,
        full_q_indices=fq_idx,
        BLOCK_SIZE=(bq, bk),
        mask_mod=mod,
    )


def _index_tensors(
    grid: np.ndarray, group: int, device: str | torch.device, sort: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean (H, R, C) -> BlockMask count (1, H * group, R) and indices (1, H * group, R, C), int32
    on `device`, each head repeated `group` times (GQA: FlexAttention indexes by query head).

    On a GPU the ordering is a stable sort there, one head at a time (what torch's own conversion
    does; seconds where the CPU's sort-free `_ordered` took minutes at 512K); elsewhere `_ordered`.
    `sort` overrides the choice (tests compare the two on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda" if sort is None else sort:
        nums, idxs = [], []
        for g in grid:
            t = torch.from_numpy(g).to(device)
            nums.append(t.sum(-1, dtype=torch.int32))
            idxs.append(torch.argsort(t.to(torch.uint8), dim=-1, descending=True, stable=True).to(torch.int32))
            del t
        num, idx = torch.stack(nums), torch.stack(idxs)
        del nums, idxs
    else:
        num, idx = (torch.from_numpy(x) for x in _ordered(grid))
    if group > 1:
        num, idx = num.repeat_interleave(group, dim=0), idx.repeat_interleave(group, dim=0)
    return num[None].to(device), idx[None].to(device)


def _transposed(grid: np.ndarray) -> np.ndarray:
    """(H, R, C) int8 -> contiguous (H, C, R); torch's blocked transpose is much faster than numpy's."""
    return torch.from_numpy(grid).transpose(1, 2).contiguous().numpy()


def block_mask_dense(block_mask, seqlen_q: int, seqlen_k: int, heads: int = 1) -> np.ndarray:
    """What a BlockMask allows, pair by pair (small S only, for tests): full blocks, plus partial
    blocks where mask_mod is true. Shape (heads, seqlen_q, seqlen_k)."""
    bq, bk = block_mask.BLOCK_SIZE
    out = np.zeros((heads, seqlen_q, seqlen_k), dtype=bool)
    q = torch.arange(seqlen_q)[:, None]
    k = torch.arange(seqlen_k)[None, :]
    for h in range(heads):
        hb = min(h, block_mask.kv_num_blocks.shape[1] - 1)
        for kind, num, idx in (
            ("full", block_mask.full_kv_num_blocks, block_mask.full_kv_indices),
            ("partial", block_mask.kv_num_blocks, block_mask.kv_indices),
        ):
            allowed = np.zeros((seqlen_q, seqlen_k), dtype=bool)
            n = num[0, hb].cpu().numpy()
            ix = idx[0, hb].cpu().numpy()
            for i in range(len(n)):
                for j in ix[i, : n[i]]:
                    allowed[i * bq : (i + 1) * bq, j * bk : (j + 1) * bk] = True
            if kind == "partial":
                mm = block_mask.mask_mod(torch.zeros((), dtype=torch.int64), torch.tensor(h), q, k).cpu().numpy()
                allowed &= mm
            out[h] |= allowed
    return out


def mask_block_counts(mask: Mask, block_q: int, block_k: int) -> np.ndarray:
    """int64 (heads, n_q_blocks, n_k_blocks): exact attended pairs per block of any mask."""
    if mask.blocks is not None:
        return layout_block_counts(mask.blocks, block_q, block_k)
    return np.stack(
        [
            block_counts(mask.slices_of_head(h), mask.seqlen_q, mask.seqlen_k, block_q, block_k)
            for h in range(mask.heads)
        ]
    )

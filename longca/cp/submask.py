"""Cut a global slice mask into the sub-mask between two ranks' local token layouts.

A layout is a list of global [start, end) intervals whose concatenation is the local sequence.
The sub-mask between query layout A and key layout B is, for every (interval a, interval b), the
global slices clipped to the rectangle a x b and shifted into local coordinates. It holds exactly
the pairs of the global mask between those tokens, so per-step areas add up to the global area.

Block-sparse masks (per KV head, no slices) are cut the same way at block level: `sub_layout`
gives the local BlockLayout between two layouts (blocks split where a shard boundary crosses
them), `layout_step_areas` the exact per-head areas of every (participant, participant) pair.
"""

from __future__ import annotations

import numpy as np

from longca.masks import slices as sl
from longca.masks.blocks import BlockLayout

Layout = tuple[tuple[int, int], ...]


def _offsets(layout: Layout) -> list[int]:
    out, acc = [], 0
    for s, e in layout:
        out.append(acc)
        acc += e - s
    return out


def sub_mask(global_slices: np.ndarray, q_layout: Layout, k_layout: Layout) -> np.ndarray:
    """Local (N, 5) slices of the pairs between q_layout's and k_layout's tokens."""
    g = np.asarray(global_slices, dtype=np.int64).reshape(-1, 5)
    parts = []
    for (qa, qb), qo in zip(q_layout, _offsets(q_layout)):
        rows = g[(g[:, 0] < qb) & (g[:, 1] > qa)]  # prefilter: clip_slices loops in Python
        for (ka, kb), ko in zip(k_layout, _offsets(k_layout)):
            hit = rows[(rows[:, 2] < kb) & (rows[:, 3] > ka)]
            if len(hit):
                parts.append(sl.shift_slices(sl.clip_slices(hit, qa, qb, ka, kb), qo - qa, ko - ka))
    return coalesce(sl.concat(parts))


def coalesce(slices: np.ndarray) -> np.ndarray:
    """Merge FULL slices that share a q range and touch in k (then the same with q and k swapped),
    then causal squares joined on the diagonal by the FULL block below them, so that kernels taking
    whole rectangles make as few calls as possible. Same pairs, same area."""
    return _merge_causal_diagonal(_merge_full(slices))


def _merge_causal_diagonal(s: np.ndarray) -> np.ndarray:
    """Causal squares A = [a, b) x [c, d) and C = [b, e) x [d, f) with the FULL block [b, e) x [c, d)
    between them are one causal square [a, e) x [c, f): zigzag's own-KV ring step (head chunk, tail
    chunk) is exactly that, and one causal call at twice the length runs faster than three calls."""
    rows = [tuple(r) for r in s.tolist()]
    causal, full = int(sl.Kind.CAUSAL), int(sl.Kind.FULL)
    if len(set(rows)) != len(rows):  # repeated slices are not disjoint pieces: leave them as they are
        return s
    merged_any, changed = False, True
    while changed:
        changed = False
        present = set(rows)
        squares = {(r[0], r[2]): r for r in rows if r[4] == causal and r[1] - r[0] == r[3] - r[2]}
        for a in list(squares.values()):
            c = squares.get((a[1], a[3]))
            if c is None or a not in present or c not in present:
                continue
            f = (a[1], c[1], a[2], a[3], full)
            if f in present:
                present -= {a, c, f}
                present.add((a[0], c[1], a[2], c[3], causal))
                changed = merged_any = True
        rows = sorted(present)
    return np.asarray(rows, dtype=np.int64).reshape(-1, 5) if merged_any else s


def _merge_full(slices: np.ndarray) -> np.ndarray:
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    full = s[s[:, 4] == sl.Kind.FULL]
    rest = s[s[:, 4] != sl.Kind.FULL]
    for a, b, c, d in ((0, 1, 2, 3), (2, 3, 0, 1)):
        if len(full) < 2:
            break
        order = np.lexsort((full[:, c], full[:, b], full[:, a]))
        merged: list[list[int]] = []
        for row in full[order].tolist():
            last = merged[-1] if merged else None
            if last and last[a] == row[a] and last[b] == row[b] and last[d] == row[c]:
                last[d] = row[d]
            else:
                merged.append(row)
        full = np.asarray(merged, dtype=np.int64).reshape(-1, 5)
    return sl.concat([full, rest])


def layouts_of_groups(rank_intervals: tuple[Layout, ...], groups: list[list[int]]) -> list[Layout]:
    """Layout of each group of ranks: the concatenation of its members' layouts, in member order
    (what a Ulysses all-to-all assembles on every member of the group)."""
    return [tuple(iv for r in members for iv in rank_intervals[r]) for members in groups]


# ------------------------------------------------------------------------- block-sparse layouts
def cut_bounds(bounds: np.ndarray, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Global block bounds cut by a token layout: (local bounds, global block of each local block).

    Every interval [a, b) of the layout contributes the pieces of the global blocks it overlaps,
    shifted to local coordinates: a block that straddles a shard boundary becomes a shorter local
    block (so shard boundaries need not fall on block boundaries)."""
    bounds = np.asarray(bounds, dtype=np.int64)
    edges: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
    blocks: list[np.ndarray] = []
    off = 0
    for a, b in layout:
        if not 0 <= a < b <= bounds[-1]:
            raise ValueError(f"interval [{a}, {b}) is outside the mask's [0, {int(bounds[-1])})")
        first = int(np.searchsorted(bounds, a, side="right")) - 1
        last = int(np.searchsorted(bounds, b, side="left"))  # blocks first .. last-1 overlap [a, b)
        edges.append(np.append(bounds[first + 1 : last], b) - a + off)
        blocks.append(np.arange(first, last, dtype=np.int64))
        off += b - a
    return np.concatenate(edges), np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.int64)


def sub_layout(layout: BlockLayout, q_layout: Layout, k_layout: Layout, heads: np.ndarray | None = None) -> BlockLayout:
    """The block layout between q_layout's and k_layout's tokens, in local coordinates, for the KV
    heads `heads` (indices into layout.kept, default all): local block (i, j) of head h is kept iff
    the global blocks it comes from are kept for that head. Derived from the block lists alone
    (never an S x S tensor); its dense form is the global dense mask restricted to those tokens."""
    qb, qi = cut_bounds(layout.q_bounds, q_layout)
    kb, ki = cut_bounds(layout.k_bounds, k_layout)
    h = np.arange(layout.heads) if heads is None else np.asarray(heads, dtype=np.int64)
    kept = np.asarray(layout.kept)[np.ix_(h, qi, ki)]
    sizes = np.concatenate([np.diff(qb), np.diff(kb)])
    uniform = int(sizes[0]) if len(sizes) and np.all(sizes == sizes[0]) else None
    return BlockLayout(qb, kb, kept, uniform)


def tokens_per_block(bounds: np.ndarray, layout: Layout) -> np.ndarray:
    """(n_blocks,) int64: how many of the layout's tokens fall in each global block."""
    bounds = np.asarray(bounds, dtype=np.int64)
    out = np.zeros(len(bounds) - 1, dtype=np.int64)
    for a, b in layout:
        first = int(np.searchsorted(bounds, a, side="right")) - 1
        last = int(np.searchsorted(bounds, b, side="left"))
        i = np.arange(first, last)
        out[i] += np.minimum(bounds[i + 1], b) - np.maximum(bounds[i], a)
    return out


def layout_step_areas(layout: BlockLayout, layouts: list[Layout]) -> np.ndarray:
    """(heads, r, r) int64: attended pairs of each KV head between participants i (queries) and
    j (keys), from per-block token counts (exact, no sub-layout built): cq_i^T kept_h ck_j."""
    if layout.k_bounds[-1] >= 2**24 or layout.q_bounds[-1] >= 2**26:
        raise ValueError("sequence too long for exact float block-area sums")
    cq = np.stack([tokens_per_block(layout.q_bounds, lay) for lay in layouts]).astype(np.float64)
    ck = np.stack([tokens_per_block(layout.k_bounds, lay) for lay in layouts]).astype(np.float32)
    out = np.empty((layout.heads, len(layouts), len(layouts)), dtype=np.int64)
    for h in range(layout.heads):
        # Exact: kept keys per (query block, participant) are integers <= S_k < 2^24 (float32),
        # and the outer sums < S^2 < 2^53 (float64).
        keys = np.asarray(layout.kept[h], dtype=np.float32) @ ck.T
        out[h] = np.rint(cq @ keys.astype(np.float64)).astype(np.int64)
    return out

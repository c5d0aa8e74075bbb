"""Cut a global slice mask into the sub-mask between two ranks' local token layouts.

A layout is a list of global [start, end) intervals whose concatenation is the local sequence.
The sub-mask between query layout A and key layout B is, for every (interval a, interval b), the
global slices clipped to the rectangle a x b and shifted into local coordinates. It holds exactly
the pairs of the global mask between those tokens, so per-step areas add up to the global area.
"""

from __future__ import annotations

import numpy as np

from longca.masks import slices as sl

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
    so that kernels taking whole rectangles make as few calls as possible. Same pairs, same area."""
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

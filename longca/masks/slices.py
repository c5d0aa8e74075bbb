"""The one representation of an attention mask: non-overlapping (q_range, k_range, kind) slices.

A slice covers q in [q0, q1) and k in [k0, k1) and allows, with q' = q - q0, k' = k - k0,
m = q1 - q0, n = k1 - k0:

- FULL:      every pair;
- CAUSAL:    k' <= q' + (n - m)          (bottom-right aligned: the last query sees every key);
- INVCAUSAL: k' >= q'                    (top-left aligned mirror);
- BICAUSAL:  q' <= k' <= q' + (n - m)    (both; a band).

Slices are stored as an int64 array of shape (N, 5): q0, q1, k0, k1, kind. Areas, dense
matrices and block lists are derived from that array, never stored beside it.
"""

from __future__ import annotations

import enum

import numpy as np

SLICE_COLUMNS = ("q0", "q1", "k0", "k1", "kind")


class Kind(enum.IntEnum):
    FULL = 0
    CAUSAL = 1
    INVCAUSAL = 2
    BICAUSAL = 3


def make_slices(rows: list[tuple[int, int, int, int, int]] | np.ndarray) -> np.ndarray:
    """Build the (N, 5) int64 slice array, dropping empty rectangles."""
    arr = np.asarray(rows, dtype=np.int64).reshape(-1, 5)
    keep = (arr[:, 1] > arr[:, 0]) & (arr[:, 3] > arr[:, 2])
    return np.ascontiguousarray(arr[keep])


def concat(parts: list[np.ndarray]) -> np.ndarray:
    parts = [p for p in parts if len(p)]
    if not parts:
        return np.zeros((0, 5), dtype=np.int64)
    return np.ascontiguousarray(np.concatenate(parts, axis=0))


def slice_areas(slices: np.ndarray) -> np.ndarray:
    """Exact number of allowed (q, k) pairs of each slice, in closed form (vectorised)."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    m = s[:, 1] - s[:, 0]
    n = s[:, 3] - s[:, 2]
    kind = s[:, 4]
    full = m * n
    # CAUSAL and INVCAUSAL have the same area by symmetry: rows keep min(n, ...) keys.
    tri = np.where(n >= m, m * (n - m + 1) + m * (m - 1) // 2, n * (n + 1) // 2)
    band = np.where(n >= m, m * (n - m + 1), 0)
    out = np.select(
        [kind == Kind.FULL, (kind == Kind.CAUSAL) | (kind == Kind.INVCAUSAL), kind == Kind.BICAUSAL],
        [full, tri, band],
        default=-1,
    )
    if (out < 0).any():
        raise ValueError(f"unknown slice kind in {np.unique(kind).tolist()}")
    return out


def area(slices: np.ndarray) -> int:
    """Exact attended area of a slice list (slices never overlap, so areas add)."""
    return int(slice_areas(slices).sum())


def row_bounds(slice_row: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Allowed key interval [lo, hi) of one slice for query positions q (inside the slice)."""
    q0, q1, k0, k1, kind = (int(x) for x in slice_row)
    qp = q - q0
    shift = (k1 - k0) - (q1 - q0)
    lo = np.full_like(q, k0)
    hi = np.full_like(q, k1)
    if kind in (Kind.CAUSAL, Kind.BICAUSAL):
        hi = np.minimum(hi, k0 + qp + shift + 1)
    if kind in (Kind.INVCAUSAL, Kind.BICAUSAL):
        lo = np.maximum(lo, k0 + qp)
    return lo, np.maximum(hi, lo)


def to_dense(slices: np.ndarray, seqlen_q: int, seqlen_k: int) -> np.ndarray:
    """Dense boolean (seqlen_q, seqlen_k) matrix. For tests and small references only."""
    return to_dense_tensor(slices, seqlen_q, seqlen_k, "cpu").numpy()


def to_dense_tensor(slices: np.ndarray, seqlen_q: int, seqlen_k: int, device, rows: int = 8192):
    """Dense boolean (seqlen_q, seqlen_k) tensor on `device` (a GPU fills a 48K x 48K mask in
    milliseconds). Each slice fills only its own rectangle, as triangles: with r, c local to the
    rectangle and shift = width - height, CAUSAL keeps c - r <= shift (tril), INVCAUSAL c >= r
    (triu), BICAUSAL both (see row_bounds). Query rows go `rows` at a time to bound temporaries."""
    import torch

    dense = torch.zeros((seqlen_q, seqlen_k), dtype=torch.bool, device=device)
    for row in np.asarray(slices).reshape(-1, 5):
        q0, q1, k0, k1, kind = (int(x) for x in row)
        shift = (k1 - k0) - (q1 - q0)
        for a in range(q0, q1, rows):
            b = min(a + rows, q1)
            block = torch.ones((b - a, k1 - k0), dtype=torch.bool, device=device)
            if kind in (Kind.CAUSAL, Kind.BICAUSAL):
                block = block.tril(shift + a - q0)
            if kind in (Kind.INVCAUSAL, Kind.BICAUSAL):
                block = block.triu(a - q0)
            dense[a:b, k0:k1] |= block
    return dense


def band_slices(q0: int, q1: int, k0: int, k1: int, lo: int, hi: int) -> np.ndarray:
    """Slices covering {(q, k): q0 <= q < q1, k0 <= k < k1, lo <= k - q <= hi}.

    Every mask of the catalogue is a union of such bands (causal: lo = -inf, hi = 0; a sliding
    window: lo = -w, hi = w; a full rectangle: lo = -inf, hi = +inf), so one careful function
    gives every mask its slices. Rows split where a bound switches between the rectangle's edge
    and the diagonal; each piece is FULL, CAUSAL, INVCAUSAL or BICAUSAL.
    """
    if q1 <= q0 or k1 <= k0 or lo > hi:
        return np.zeros((0, 5), dtype=np.int64)
    big = (q1 - q0) + (k1 - k0) + 1
    lo = max(lo, k0 - q1 - big)
    hi = min(hi, k1 - q0 + big)
    # Rows whose interval [max(k0, q+lo), min(k1-1, q+hi)] is non-empty.
    qa = max(q0, k0 - hi)
    qb = min(q1, k1 - lo)
    if qb <= qa:
        return np.zeros((0, 5), dtype=np.int64)
    left_diag_from = k0 - lo  # left bound is q + lo for q >= this, k0 before
    right_const_from = k1 - hi  # right bound is k1 - 1 for q >= this, q + hi before
    cuts = sorted({qa, qb, *(c for c in (left_diag_from, right_const_from) if qa < c < qb)})
    rows = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        left_diag = a >= left_diag_from
        right_const = a >= right_const_from
        if not left_diag and right_const:
            rows.append((a, b, k0, k1, Kind.FULL))
        elif not left_diag and not right_const:
            rows.append((a, b, k0, b + hi, Kind.CAUSAL))
        elif left_diag and right_const:
            rows.append((a, b, a + lo, k1, Kind.INVCAUSAL))
        else:
            rows.append((a, b, a + lo, b + hi, Kind.BICAUSAL))
    return make_slices(rows)


def shift_slices(slices: np.ndarray, dq: int = 0, dk: int = 0) -> np.ndarray:
    out = np.array(slices, dtype=np.int64, copy=True).reshape(-1, 5)
    out[:, 0:2] += dq
    out[:, 2:4] += dk
    return out


def clip_slices(slices: np.ndarray, q0: int, q1: int, k0: int, k1: int) -> np.ndarray:
    """Restrict slices to the rectangle [q0, q1) x [k0, k1), keeping exactly the same pairs.

    Used to cut a global mask into the sub-mask of one (rank, step) of context parallelism.
    Each slice is a band of k - q, so its intersection with a rectangle is again a band.
    """
    parts = []
    for row in np.asarray(slices).reshape(-1, 5):
        a, b, c, d, kind = (int(x) for x in row)
        shift = (d - c) - (b - a)
        band_lo = c - a if kind in (Kind.INVCAUSAL, Kind.BICAUSAL) else -(1 << 62)
        band_hi = c - a + shift if kind in (Kind.CAUSAL, Kind.BICAUSAL) else (1 << 62)
        parts.append(band_slices(max(a, q0), min(b, q1), max(c, k0), min(d, k1), band_lo, band_hi))
    return concat(parts)


def _pairs_below(t: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, d: np.ndarray) -> np.ndarray:
    """#{(q, k): a <= q < b, c <= k < d, k - q <= t}, elementwise, in closed form.

    Row q keeps clip(q + t + 1 - c, 0, n) keys (n = d - c); summing that over consecutive q is a
    difference of the cumulative sum C(x) = sum_{0 <= y < x} clip(y, 0, n)."""
    n = d - c
    t = np.clip(t, c - b - 1, d - a)  # beyond these bounds the count is 0 or the full rectangle

    def cum(x: np.ndarray) -> np.ndarray:
        x = np.maximum(x, 0)
        inside = x * (x - 1) // 2
        beyond = n * (n + 1) // 2 + (x - n - 1) * n
        return np.where(x <= n + 1, inside, beyond)

    return cum(b + t + 1 - c) - cum(a + t + 1 - c)


def area_in_rect(slices: np.ndarray, q0, q1, k0, k1) -> np.ndarray:
    """Exact attended pairs of each slice inside the rectangle [q0, q1) x [k0, k1).

    Vectorised: the rectangle bounds may be arrays broadcasting against the slices (one row per
    slice), so block grids and per-rank CP areas are computed without materialising masks."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    a0, a1, c0, c1, kind = (s[:, i] for i in range(5))
    big = np.int64(1 << 62)
    shift = (c1 - c0) - (a1 - a0)
    t_hi = np.where((kind == Kind.CAUSAL) | (kind == Kind.BICAUSAL), c0 - a0 + shift, big)
    t_lo = np.where((kind == Kind.INVCAUSAL) | (kind == Kind.BICAUSAL), c0 - a0, -big)
    a = np.maximum(a0, q0)
    b = np.minimum(a1, q1)
    c = np.maximum(c0, k0)
    d = np.minimum(c1, k1)
    empty = (b <= a) | (d <= c)
    b, d = np.maximum(b, a), np.maximum(d, c)
    out = _pairs_below(t_hi, a, b, c, d) - _pairs_below(t_lo - 1, a, b, c, d)
    return np.where(empty, 0, out)


def key_bounds(slices: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Allowed key interval [lo, hi) of slice i for query q[i] (vectorised row_bounds).

    Both bounds are non-decreasing in q within a slice; an empty row has hi == lo."""
    s = np.asarray(slices, dtype=np.int64).reshape(-1, 5)
    q0, q1, k0, k1, kind = (s[:, i] for i in range(5))
    qp = q - q0
    shift = (k1 - k0) - (q1 - q0)
    lo = np.where((kind == Kind.INVCAUSAL) | (kind == Kind.BICAUSAL), k0 + qp, k0)
    hi = np.where((kind == Kind.CAUSAL) | (kind == Kind.BICAUSAL), np.minimum(k1, k0 + qp + shift + 1), k1)
    lo = np.minimum(lo, k1)
    return lo, np.maximum(hi, lo)

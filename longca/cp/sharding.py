"""Which global token positions each rank holds: a list of [start, end) intervals per rank.

A rank's local sequence is the concatenation of its intervals, in order. Every rank holds the
same number of tokens (collectives exchange equal-sized buffers). Three policies:

- contiguous: rank r holds [r S/W, (r+1) S/W);
- zigzag:     the sequence cut into 2W chunks, rank r holds chunks r and 2W-1-r (head-to-tail),
              which balances causal-type masks;
- document:   the sequence cut into `chunks_per_rank` x W chunks, assigned greedily (largest
              attended area first, to the least loaded rank with room) so that each rank's
              attended area is balanced for any mask, document masks included; a rank's
              chunks are kept in sequence order and adjacent ones merged. By default the
              fewest chunks per rank (4, 8, 16 or 32, chunks of at least MIN_CHUNK tokens) that
              bring the busiest rank within BALANCE_TOL of the mean: 4 per rank left ranks 6-8%
              above the mean at 256K for the document masks (measured on one H200, 2026-12-02), 16
              bring them within 1%; more chunks mean more pieces per rank, so no more than needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longca.masks import slices as sl

BALANCES = ("contiguous", "zigzag", "document")


@dataclass(frozen=True)
class Sharding:
    """Per-rank global intervals. `intervals[r]` is a tuple of (start, end) pairs."""

    balance: str
    seqlen: int
    intervals: tuple[tuple[tuple[int, int], ...], ...]

    @property
    def world_size(self) -> int:
        return len(self.intervals)

    @property
    def local_len(self) -> int:
        return sum(e - s for s, e in self.intervals[0])

    def positions(self, rank: int) -> np.ndarray:
        """Global positions of rank's local tokens, in local order."""
        return np.concatenate([np.arange(s, e) for s, e in self.intervals[rank]]).astype(np.int64)

    def permutation(self) -> np.ndarray:
        """Global positions in sharded order (rank 0's tokens, then rank 1's, ...)."""
        return np.concatenate([self.positions(r) for r in range(self.world_size)])


def _check_divisible(seqlen: int, parts: int, balance: str, world: int) -> None:
    if seqlen % parts:
        raise ValueError(
            f"seqlen={seqlen} is not divisible by {parts} (balance={balance!r} with world_size={world} "
            f"cuts the sequence into {parts} equal chunks)"
        )


def contiguous(seqlen: int, world: int) -> Sharding:
    _check_divisible(seqlen, world, "contiguous", world)
    n = seqlen // world
    return Sharding("contiguous", seqlen, tuple(((r * n, (r + 1) * n),) for r in range(world)))


def zigzag(seqlen: int, world: int) -> Sharding:
    _check_divisible(seqlen, 2 * world, "zigzag", world)
    c = seqlen // (2 * world)
    return Sharding(
        "zigzag",
        seqlen,
        tuple(((r * c, (r + 1) * c), ((2 * world - 1 - r) * c, (2 * world - r) * c)) for r in range(world)),
    )


def _merge(chunks: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[list[int]] = []
    for s, e in sorted(chunks):
        if out and out[-1][1] == s:
            out[-1][1] = e
        else:
            out.append([s, e])
    return tuple((a, b) for a, b in out)


def row_areas(slices: np.ndarray, seqlen: int) -> np.ndarray:
    """Attended keys of every query row (length seqlen), from the slices."""
    counts = np.zeros(seqlen, dtype=np.int64)
    for row in np.asarray(slices).reshape(-1, 5):
        q = np.arange(row[0], row[1])
        lo, hi = sl.row_bounds(row, q)
        counts[row[0] : row[1]] += hi - lo
    return counts


CHUNKS_PER_RANK = (4, 8, 16, 32)  # tried in order by `document` when no count is given
MIN_CHUNK = 1024  # tokens: finer chunks only cut more blocks at their edges
BALANCE_TOL = 0.01  # busiest rank's area over the mean, minus 1


def document(seqlen: int, world: int, slices: np.ndarray, chunks_per_rank: int | None = None) -> Sharding:
    """Area-balanced assignment of equal chunks (see the module docstring); `chunks_per_rank`
    None picks the count."""
    areas = row_areas(slices, seqlen)
    if chunks_per_rank is not None:
        return _document(seqlen, world, areas, chunks_per_rank)[0]
    best = None
    for n in CHUNKS_PER_RANK:
        if n != CHUNKS_PER_RANK[0] and (seqlen % (world * n) or seqlen // (world * n) < MIN_CHUNK):
            continue
        s, per_rank = _document(seqlen, world, areas, n)
        spread = _spread(per_rank)
        if best is None or spread < best[0]:
            best = (spread, s)
        if spread <= BALANCE_TOL:
            break
    return best[1]


def imbalance(sharding: Sharding, areas: np.ndarray) -> float:
    """The busiest rank's attended area over the mean, minus 1 (0 = perfectly even)."""
    return _spread([int(areas[sharding.positions(r)].sum()) for r in range(sharding.world_size)])


def _spread(per_rank) -> float:
    mean = sum(per_rank) / len(per_rank)
    return max(per_rank) / mean - 1.0 if mean else 0.0


def _document(seqlen: int, world: int, areas: np.ndarray, chunks_per_rank: int) -> tuple[Sharding, list[int]]:
    """The greedy assignment and each rank's attended area under it."""
    parts = world * chunks_per_rank
    _check_divisible(seqlen, parts, "document", world)
    c = seqlen // parts
    load = np.add.reduceat(areas, np.arange(0, seqlen, c))
    ranks_load = np.zeros(world, dtype=np.int64)
    room = np.full(world, chunks_per_rank)
    chosen: list[list[tuple[int, int]]] = [[] for _ in range(world)]
    # Stable order: largest load first, ties by position, so every rank computes the same plan.
    for i in sorted(range(parts), key=lambda i: (-int(load[i]), i)):
        cand = [r for r in range(world) if room[r] > 0]
        r = min(cand, key=lambda r: (int(ranks_load[r]), r))
        chosen[r].append((i * c, (i + 1) * c))
        ranks_load[r] += load[i]
        room[r] -= 1
    return Sharding("document", seqlen, tuple(_merge(ch) for ch in chosen)), [int(x) for x in ranks_load]


def granule(balance: str, world: int, chunks_per_rank: int = CHUNKS_PER_RANK[0]) -> int:
    """The sequence length must be a multiple of this for `balance` at `world` ranks (`document`
    uses more chunks only where the length allows)."""
    return {"contiguous": world, "zigzag": 2 * world, "document": chunks_per_rank * world}[balance]


def make_sharding(balance: str, seqlen: int, world: int, slices: np.ndarray | None = None) -> Sharding:
    """The sharding named by `balance` (one of BALANCES)."""
    if balance == "contiguous":
        return contiguous(seqlen, world)
    if balance == "zigzag":
        return zigzag(seqlen, world)
    if balance == "document":
        if slices is None:
            raise ValueError("balance='document' needs the mask's slices")
        return document(seqlen, world, slices)
    raise ValueError(f"unknown balance {balance!r}; allowed: {list(BALANCES)}")

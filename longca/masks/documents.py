"""Seeded document-length sampling: documents are drawn until they fill S (the last truncated).

For distributed (context-parallel) runs the paper drew 60% of the tokens as long documents of
U[8K, 30K] and the rest from the histogram, so that documents span ranks: `long_fraction`
reproduces that (the long documents first, then the histogram ones, then the order shuffled).
"""

from __future__ import annotations

import numpy as np

from longca.masks import distributions

LONG_DOC_RANGE = (8 * 1024, 30 * 1024)  # the paper's U[8K, 30K] long documents


def _fill(total: int, draw, rng: np.random.Generator) -> list[int]:
    lengths: list[int] = []
    filled = 0
    while filled < total:
        for x in draw(rng, 256):
            x = min(max(1, int(x)), total - filled)
            lengths.append(x)
            filled += x
            if filled >= total:
                break
    return lengths


def sample_documents(
    total: int, distribution: str, rng: np.random.Generator, *, long_fraction: float = 0.0
) -> tuple[int, ...]:
    """Document lengths summing exactly to `total`, drawn from a concrete named distribution.

    `distribution` must already be resolved (not "auto"); see distributions.resolve.
    """
    if total < 1:
        raise ValueError(f"documents: total length must be >= 1, got {total}")
    if not 0.0 <= long_fraction <= 1.0:
        raise ValueError(f"long_fraction={long_fraction!r} is outside [0, 1]")
    draw = distributions.sampler(distributions.resolve(distribution, total))
    n_long = int(round(long_fraction * total))
    lengths: list[int] = []
    if n_long:
        lo, hi = LONG_DOC_RANGE
        lengths += _fill(n_long, lambda r, n: r.integers(lo, hi + 1, size=n), rng)
    if total - n_long:
        lengths += _fill(total - n_long, draw, rng)
    if n_long:
        rng.shuffle(lengths)
    return tuple(int(x) for x in lengths)

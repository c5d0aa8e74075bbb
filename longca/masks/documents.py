"""Seeded document-length sampling: documents are drawn until they fill S (the last truncated)."""

from __future__ import annotations

import numpy as np

# Distribution name -> sampler(rng, n) returning n lengths >= 1. Extended by the shipped
# histogram distributions (see longca.masks.distributions when present).
DISTRIBUTIONS: dict[str, object] = {}


def uniform_sampler(low: int = 1, high: int = 8192):
    def sample(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(low, high + 1, size=n)

    return sample


DISTRIBUTIONS["uniform"] = uniform_sampler()


def sample_documents(total: int, distribution: str, rng: np.random.Generator) -> tuple[int, ...]:
    """Document lengths summing exactly to `total`, drawn from a named distribution."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown document distribution {distribution!r}; allowed: {sorted(DISTRIBUTIONS)}")
    sampler = DISTRIBUTIONS[distribution]
    lengths: list[int] = []
    filled = 0
    while filled < total:
        for x in sampler(rng, 64):
            x = int(max(1, x))
            x = min(x, total - filled)
            lengths.append(x)
            filled += x
            if filled >= total:
                break
    return tuple(lengths)

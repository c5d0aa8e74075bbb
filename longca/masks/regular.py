"""The six regular masks: full, causal, full/causal document, full/causal sliding window."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from longca.masks import slices as sl

INF = 1 << 62


def full(seqlen_q: int, seqlen_k: int) -> np.ndarray:
    return sl.make_slices([(0, seqlen_q, 0, seqlen_k, sl.Kind.FULL)])


def causal(seqlen_q: int, seqlen_k: int) -> np.ndarray:
    """k <= q (top-left aligned on the diagonal when seqlen_q == seqlen_k)."""
    return sl.band_slices(0, seqlen_q, 0, seqlen_k, -INF, 0)


def doc_bounds(documents: Sequence[int]) -> list[tuple[int, int]]:
    ends = np.cumsum(documents)
    return [(int(e - d), int(e)) for d, e in zip(documents, ends)]


def full_document(documents: Sequence[int]) -> np.ndarray:
    return sl.make_slices([(s, e, s, e, sl.Kind.FULL) for s, e in doc_bounds(documents)])


def causal_document(documents: Sequence[int]) -> np.ndarray:
    return sl.concat([sl.band_slices(s, e, s, e, -INF, 0) for s, e in doc_bounds(documents)])


def sliding_window(seqlen: int, window: int) -> np.ndarray:
    """|q - k| <= window."""
    return sl.band_slices(0, seqlen, 0, seqlen, -window, window)


def causal_sliding_window(seqlen: int, window: int) -> np.ndarray:
    """0 <= q - k <= window."""
    return sl.band_slices(0, seqlen, 0, seqlen, -window, 0)

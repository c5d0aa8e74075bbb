"""The six heterogeneous masks, each a union of bands of k - q (see slices.band_slices).

Every function takes the resolved lengths and parameters and returns non-overlapping slices.
Document lists sum to the sequence length; a document spans [start, end).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from longca.masks import slices as sl
from longca.masks.regular import INF, doc_bounds


def _causal(q0: int, q1: int, k0: int, k1: int) -> np.ndarray:
    """Bottom-right aligned causal over a rectangle: the last query sees every key."""
    return sl.band_slices(q0, q1, k0, k1, -INF, k1 - q1)  # k - q <= k1 - q1


def share_question(documents: Sequence[int]) -> np.ndarray:
    """Document 0 is a question (causal); each later document sees the whole question plus
    itself causally."""
    bounds = doc_bounds(documents)
    qs, qe = bounds[0]
    parts = [_causal(qs, qe, qs, qe)]
    for s, e in bounds[1:]:
        parts.append(sl.make_slices([(s, e, qs, qe, sl.Kind.FULL)]))
        parts.append(_causal(s, e, s, e))
    return sl.concat(parts)


def causal_blockwise(documents: Sequence[int]) -> np.ndarray:
    """Each document causal on itself; the last one sees every earlier token and itself causally."""
    bounds = doc_bounds(documents)
    parts = [_causal(s, e, s, e) for s, e in bounds[:-1]]
    s, e = bounds[-1]
    parts.append(_causal(s, e, 0, e))  # keys [0, s) fully, then causal on itself
    return sl.concat(parts)


def global_sliding_window(seqlen: int, global_tokens: int, window: int) -> np.ndarray:
    """The first g tokens attend and are attended by everything; other pairs |q - k| <= w."""
    g = min(global_tokens, seqlen)
    return sl.concat(
        [
            sl.make_slices([(0, g, 0, seqlen, sl.Kind.FULL), (g, seqlen, 0, g, sl.Kind.FULL)]),
            sl.band_slices(g, seqlen, g, seqlen, -window, window),
        ]
    )


def prefix_lm_causal(seqlen: int, prefix: int) -> np.ndarray:
    """Queries and keys in [0, p) attend each other fully; later queries are causal (k <= q)."""
    p = min(prefix, seqlen)
    return sl.concat([sl.make_slices([(0, p, 0, p, sl.Kind.FULL)]), _causal(p, seqlen, 0, seqlen)])


def prefix_lm_document(documents: Sequence[int], prefix: int) -> np.ndarray:
    """Per document: its first min(p, L) tokens full among themselves, the rest causal in it."""
    parts = []
    for s, e in doc_bounds(documents):
        m = s + min(prefix, e - s)
        parts.append(sl.make_slices([(s, m, s, m, sl.Kind.FULL)]))
        parts.append(_causal(m, e, s, e))
    return sl.concat(parts)


def block_causal_document(documents: Sequence[int], block: int) -> np.ndarray:
    """Per document cut into blocks of B tokens: a query in block i sees blocks 0..i of its
    document (full attention inside a block; the last block of a document may be short)."""
    rows = []
    for s, e in doc_bounds(documents):
        for a in range(s, e, block):
            b = min(a + block, e)
            rows.append((a, b, s, b, sl.Kind.FULL))
    return sl.make_slices(rows)

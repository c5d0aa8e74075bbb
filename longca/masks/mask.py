"""A mask instance: its name, parameters, lengths and slices (the single source of truth)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longca.masks import slices as sl
from longca.masks.blocks import BlockLayout


@dataclass(frozen=True, eq=False)
class Mask:
    """A concrete mask over seqlen_q queries and seqlen_k keys.

    `slices` is the (N, 5) int64 array of longca.masks.slices. `documents` holds document
    lengths for multi-document masks (they sum to seqlen_q), else None. `params` are the
    resolved parameters (sampled values included), recorded in result rows.

    Block-sparse masks differ per KV head: they carry `blocks` (kept block pairs per KV head) and
    an empty `slices`; their per-head slices are derived on demand (small S only).
    """

    name: str
    seqlen_q: int
    seqlen_k: int
    slices: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)
    documents: tuple[int, ...] | None = None
    # Masks that differ per KV head given as slices: one slice array per KV head, else None.
    head_slices: tuple[np.ndarray, ...] | None = None
    blocks: BlockLayout | None = None

    @property
    def per_head(self) -> bool:
        return self.blocks is not None or self.head_slices is not None

    @property
    def heads(self) -> int:
        """KV heads the mask distinguishes (1 when every head shares it)."""
        if self.blocks is not None:
            return self.blocks.heads
        return len(self.head_slices) if self.head_slices is not None else 1

    def area_of_heads(self) -> np.ndarray:
        """Exact attended (q, k) pairs of each KV head: shape (heads,)."""
        if self.blocks is not None:
            return self.blocks.area_per_head()
        if self.head_slices is not None:
            return np.array([sl.area(s) for s in self.head_slices], dtype=np.int64)
        return np.array([sl.area(self.slices)], dtype=np.int64)

    @property
    def area(self) -> int:
        """Exact attended (q, k) pairs, for one head (summed over heads when per-head)."""
        return int(self.area_of_heads().sum())

    @property
    def area_per_head(self) -> float:
        """Mean attended pairs per attention head (what FLOPs multiply by Hq)."""
        return float(self.area_of_heads().mean())

    @property
    def density(self) -> float:
        return self.area_per_head / (self.seqlen_q * self.seqlen_k)

    def slices_of_head(self, head: int) -> np.ndarray:
        """The slices of one KV head (the shared slices when the mask is not per head)."""
        if self.blocks is not None:
            return self.blocks.slices(head)
        if self.head_slices is not None:
            return self.head_slices[head]
        return self.slices

    def dense(self) -> np.ndarray:
        """Boolean (seqlen_q, seqlen_k), or (heads, seqlen_q, seqlen_k) for per-head masks."""
        if self.blocks is not None:
            b = self.blocks
            rq, rk = np.diff(b.q_bounds), np.diff(b.k_bounds)
            return np.repeat(np.repeat(b.kept, rq, axis=1), rk, axis=2)
        if self.head_slices is not None:
            return np.stack([sl.to_dense(s, self.seqlen_q, self.seqlen_k) for s in self.head_slices])
        return sl.to_dense(self.slices, self.seqlen_q, self.seqlen_k)

    @property
    def cu_seqlens(self) -> np.ndarray | None:
        if self.documents is None:
            return None
        return np.concatenate([[0], np.cumsum(self.documents)]).astype(np.int64)

    @property
    def num_documents(self) -> int | None:
        return None if self.documents is None else len(self.documents)

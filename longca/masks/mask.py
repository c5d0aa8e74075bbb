"""A mask instance: its name, parameters, lengths and slices (the single source of truth)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longca.masks import slices as sl


@dataclass(frozen=True, eq=False)
class Mask:
    """A concrete mask over seqlen_q queries and seqlen_k keys.

    `slices` is the (N, 5) int64 array of longca.masks.slices. `documents` holds document
    lengths for multi-document masks (they sum to seqlen_q), else None. `params` are the
    resolved parameters (sampled values included), recorded in result rows.
    """

    name: str
    seqlen_q: int
    seqlen_k: int
    slices: np.ndarray
    params: dict[str, Any] = field(default_factory=dict)
    documents: tuple[int, ...] | None = None
    # Masks that differ per KV head (block-sparse): one slice array per KV head, else None.
    head_slices: tuple[np.ndarray, ...] | None = None

    @property
    def area(self) -> int:
        """Exact attended (q, k) pairs, for one head (summed over heads when per-head)."""
        if self.head_slices is not None:
            return int(sum(sl.area(s) for s in self.head_slices))
        return sl.area(self.slices)

    @property
    def area_per_head(self) -> float:
        """Mean attended pairs per attention head (what FLOPs multiply by Hq)."""
        if self.head_slices is not None:
            return self.area / len(self.head_slices)
        return float(self.area)

    @property
    def density(self) -> float:
        return self.area_per_head / (self.seqlen_q * self.seqlen_k)

    def dense(self) -> np.ndarray:
        """Boolean (seqlen_q, seqlen_k), or (Hkv, seqlen_q, seqlen_k) for per-head masks."""
        if self.head_slices is not None:
            return np.stack([sl.to_dense(s, self.seqlen_q, self.seqlen_k) for s in self.head_slices])
        return sl.to_dense(self.slices, self.seqlen_q, self.seqlen_k)

    @property
    def cu_seqlens(self) -> np.ndarray | None:
        if self.documents is None:
            return None
        return np.concatenate([[0], np.cumsum(self.documents)]).astype(np.int64)

"""Block-level layout of a block-sparse mask: the form sparse kernels and BlockMasks consume.

Query blocks are [q_bounds[i], q_bounds[i+1]), key blocks [k_bounds[j], k_bounds[j+1]); uniform
blocks have equal spacing (the last may be short), variable blocks arbitrary spacing. `kept` is a
boolean (heads_kv, n_q_blocks, n_k_blocks) array: True where the block pair is attended (fully).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longca.masks import slices as sl


@dataclass(frozen=True, eq=False)
class BlockLayout:
    q_bounds: np.ndarray  # (n_q_blocks + 1,) int64, starts at 0, ends at seqlen_q
    k_bounds: np.ndarray  # (n_k_blocks + 1,) int64
    kept: np.ndarray  # (heads_kv, n_q_blocks, n_k_blocks) bool
    uniform_block: int | None = None  # block size when uniform, else None

    @property
    def heads(self) -> int:
        return int(self.kept.shape[0])

    def area_per_head(self) -> np.ndarray:
        qs = np.diff(self.q_bounds)
        ks = np.diff(self.k_bounds)
        if int(self.k_bounds[-1]) >= 2**24:  # float32 row sums stop being exact integers
            return np.einsum("hij,i,j->h", self.kept.astype(np.int64), qs, ks)
        # Kept key tokens per query block as a float32 product, exact below 2^24 and BLAS-fast: the
        # int64 einsum copied the whole kept array (4.3 GB at 512K, block 64).
        kf = ks.astype(np.float32)
        per_row = np.stack([self.kept[h].astype(np.float32) @ kf for h in range(self.heads)])
        return per_row.astype(np.int64) @ qs

    def slices(self, head: int) -> np.ndarray:
        """Slices of one KV head: one FULL rectangle per kept block pair (small S only)."""
        i, j = np.nonzero(self.kept[head])
        return sl.make_slices(
            np.stack(
                [self.q_bounds[i], self.q_bounds[i + 1], self.k_bounds[j], self.k_bounds[j + 1], np.zeros_like(i)],
                axis=1,
            )
        )

    def kv_indices(self, head: int) -> list[np.ndarray]:
        """Per query block, the sorted kept key-block indices (what sparse kernels iterate)."""
        return [np.nonzero(row)[0] for row in self.kept[head]]

"""Process sub-groups of a CP cell: a (ring x ulysses) grid, the ring optionally split into windows.

Global rank = ring_index * ulysses + ulysses_index: Ulysses groups are consecutive ranks (inside a
node, where all-to-all is cheapest), ring groups stride across them. With `windows` > 1 the ring
of `ring` participants is a double ring (LoongTrain): `windows` windows of ring/windows
consecutive participants; KV rotates inside a window (inner ring) and then moves to the next
window (outer ring).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

_GROUPS: dict[tuple, Any] = {}


def _group(ranks: list[int]):
    """A cached process group over `ranks`. Every rank must call this for every group in the same
    order (torch.distributed.new_group is collective), which `Topology.build` guarantees."""
    key = (dist.get_world_size(), tuple(ranks))
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(ranks))
    return _GROUPS[key]


@dataclass
class Topology:
    world: int
    rank: int
    ulysses: int
    ring: int
    windows: int = 1
    uly_group: Any = None
    ring_group: Any = None
    inner_group: Any = None
    outer_group: Any = None

    @property
    def uly_index(self) -> int:
        return self.rank % self.ulysses

    @property
    def ring_index(self) -> int:
        return self.rank // self.ulysses

    @property
    def window_size(self) -> int:
        return self.ring // self.windows

    def uly_members(self, ring_index: int) -> list[int]:
        return [ring_index * self.ulysses + j for j in range(self.ulysses)]

    def ring_rank(self, ring_index: int) -> int:
        """Global rank of ring participant `ring_index` in this rank's ring."""
        return ring_index * self.ulysses + self.uly_index

    @classmethod
    def build(cls, world: int, rank: int, ulysses: int, ring: int, windows: int = 1) -> Topology:
        if ulysses * ring != world:
            raise ValueError(f"degrees ulysses={ulysses} x ring={ring} must equal world_size={world}")
        if windows < 1 or ring % windows:
            raise ValueError(f"windows={windows} must divide the ring degree {ring}")
        t = cls(world, rank, ulysses, ring, windows)
        c = ring // windows
        # Create every group in one fixed order on every rank (new_group is collective).
        for i in range(ring):
            g = _group(t.uly_members(i))
            if i == t.ring_index:
                t.uly_group = g
        for j in range(ulysses):
            g = _group([i * ulysses + j for i in range(ring)])
            if j == t.uly_index:
                t.ring_group = g
        t.inner_group = t.outer_group = t.ring_group
        if 1 < windows < ring:
            for j in range(ulysses):
                for w in range(windows):
                    g = _group([(w * c + s) * ulysses + j for s in range(c)])
                    if j == t.uly_index and w == t.ring_index // c:
                        t.inner_group = g
                for s in range(c):
                    g = _group([(w * c + s) * ulysses + j for w in range(windows)])
                    if j == t.uly_index and s == t.ring_index % c:
                        t.outer_group = g
        return t

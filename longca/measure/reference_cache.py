"""Reference results shared by every kernel checked on the same problem in one process.

The float32 reference (output and q/k/v gradients) depends on the mask, its parameters, the shape,
the seed and the device type, never on the kernel: the check draws its inputs in the reference
dtype and casts them for the kernel. A sweep checks 5-8 kernels per (mask, heads, length), and at
the 8K check length one float32 reference with gradients is seconds of GPU time, most of a check.
Entries live on the host (device memory belongs to the measured kernels), least recently used
out first past a byte budget.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Hashable

import torch

NAMES = ("out", "dq", "dk", "dv")


def host_memory() -> int:
    """Bytes of the host's physical memory (8 GiB where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_budget_bytes(share: float = 0.25, cap: int = 32 << 30) -> int:
    """`share` of the host's memory, at most `cap` (by default a quarter, at most 32 GiB: the H200
    host's 128 GiB holds two sweeps' working sets, 24 (mask, heads) entries of 0.6-1 GiB at the 8K
    check length)."""
    return int(min(cap, host_memory() * share))


class ReferenceCache:
    """Least-recently-used host copies of reference tensors ('out' and, when taken, 'dq', 'dk', 'dv')."""

    def __init__(self, max_bytes: int | None = None):
        self.max_bytes = default_budget_bytes() if max_bytes is None else int(max_bytes)
        self._entries: OrderedDict[Hashable, dict[str, torch.Tensor]] = OrderedDict()
        self.bytes = 0
        self.hits = 0

    @staticmethod
    def _size(entry: dict[str, torch.Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in entry.values())

    def get(self, key: Hashable, grads: bool, device: torch.device) -> dict[str, torch.Tensor] | None:
        """The entry on `device`, or None when absent or when it lacks the gradients asked for."""
        entry = self._entries.get(key)
        if entry is None or (grads and "dq" not in entry):
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return {name: t.to(device, copy=True) for name, t in entry.items()}  # callers may not alter it

    def host(self, key: Hashable, grads: bool) -> dict[str, torch.Tensor] | None:
        """The entry's host tensors themselves (not to be altered), or None as `get`: for callers that
        move one part at a time to the device (a 512K entry with gradients is about 19 GB)."""
        entry = self._entries.get(key)
        if entry is None or (grads and "dq" not in entry):
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: Hashable, tensors: dict[str, torch.Tensor]) -> None:
        entry = {name: tensors[name].detach().to("cpu", copy=True) for name in NAMES if name in tensors}
        size = self._size(entry)
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= self._size(old)
        while self._entries and self.bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= self._size(evicted)
        self._entries[key] = entry
        self.bytes += size

    def __len__(self) -> int:
        return len(self._entries)

"""Causal blockwise: documents causal on themselves; the last sees every earlier token."""

from __future__ import annotations

from longca.masks import heterogeneous
from longca.masks.pattern import document_pattern

PATTERN = document_pattern(
    "causal_blockwise",
    "heterogeneous",
    heterogeneous.causal_blockwise,
    "documents causal on themselves; the last sees every earlier token",
    position=7,
)

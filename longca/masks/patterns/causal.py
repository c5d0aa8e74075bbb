"""Causal: each query attends the keys at or before it."""

from __future__ import annotations

from longca.masks import regular
from longca.masks.pattern import GENERIC_FORMS, MaskPattern, make_mask

PATTERN = MaskPattern(
    "causal",
    "regular",
    lambda c: make_mask(c, "causal", regular.causal(c.seqlen, c.seqlen)),
    GENERIC_FORMS | {"causal", "varlen", "window"},
    description="k <= q",
    position=1,
    window=lambda p: (-1, 0),
    causal_documents=True,
)

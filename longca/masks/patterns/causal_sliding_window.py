"""Causal sliding window: 0 <= q - k <= w."""

from __future__ import annotations

from longca.masks import regular
from longca.masks.pattern import GENERIC_FORMS, WINDOW, MaskPattern, make_mask

PATTERN = MaskPattern(
    "causal_sliding_window",
    "regular",
    lambda c: make_mask(c, "causal_sliding_window", regular.causal_sliding_window(c.seqlen, c.params["window"])),
    GENERIC_FORMS | {"window"},
    (WINDOW,),
    description="0 <= q - k <= w",
    position=5,
    window=lambda p: (int(p["window"]), 0),
    gallery=lambda s: {"window": max(1, s // 16)},
)

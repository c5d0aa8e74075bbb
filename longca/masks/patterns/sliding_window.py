"""Sliding window: |q - k| <= w."""

from __future__ import annotations

from longca.masks import regular
from longca.masks.pattern import GENERIC_FORMS, WINDOW, MaskPattern, make_mask

PATTERN = MaskPattern(
    "sliding_window",
    "regular",
    lambda c: make_mask(c, "sliding_window", regular.sliding_window(c.seqlen, c.params["window"])),
    GENERIC_FORMS | {"window"},
    (WINDOW,),
    description="|q - k| <= w",
    position=4,
    window=lambda p: (int(p["window"]), int(p["window"])),
    gallery=lambda s: {"window": max(1, s // 16)},
)

"""Full: every query attends every key."""

from __future__ import annotations

from longca.masks import regular
from longca.masks.pattern import GENERIC_FORMS, MaskPattern, make_mask

PATTERN = MaskPattern(
    "full",
    "regular",
    lambda c: make_mask(c, "full", regular.full(c.seqlen, c.seqlen)),
    GENERIC_FORMS | {"full", "varlen", "window"},
    description="every query attends every key",
    position=0,
    window=lambda p: (-1, -1),
)

"""Share question: document 0 is a question every later document sees fully."""

from __future__ import annotations

from longca.masks import heterogeneous
from longca.masks.pattern import document_pattern

PATTERN = document_pattern(
    "share_question",
    "heterogeneous",
    heterogeneous.share_question,
    "document 0 is a question; later documents see it fully and themselves causally",
    position=6,
)

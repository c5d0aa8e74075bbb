"""Full document: block diagonal over sampled documents (paper: 30 samples)."""

from __future__ import annotations

from longca.masks import regular
from longca.masks.pattern import DOCUMENT_LOCAL_FORMS, document_pattern

PATTERN = document_pattern(
    "full_document",
    "regular",
    regular.full_document,
    "block diagonal over documents",
    DOCUMENT_LOCAL_FORMS | {"varlen"},
    position=2,
)

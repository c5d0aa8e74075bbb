"""Causal document: each query attends the keys of its own document at or before it."""

from __future__ import annotations

from longca.masks import regular
from longca.masks.pattern import DOCUMENT_LOCAL_FORMS, document_pattern

PATTERN = document_pattern(
    "causal_document",
    "regular",
    regular.causal_document,
    "same document and k <= q",
    DOCUMENT_LOCAL_FORMS | {"varlen"},
    position=3,
    causal_documents=True,
)

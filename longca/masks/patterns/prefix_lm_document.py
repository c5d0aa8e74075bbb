"""Prefix-LM document: per document, a full prefix and a causal rest."""

from __future__ import annotations

from longca.masks import heterogeneous
from longca.masks.mask import Mask
from longca.masks.pattern import (
    DOC_PARAMS,
    DOCUMENT_LOCAL_FORMS,
    BuildContext,
    MaskPattern,
    Param,
    draw_documents,
    make_mask,
)


def _prefix_lm_document(ctx: BuildContext) -> Mask:
    docs, dist = draw_documents(ctx)
    p = ctx.params["prefix"]
    if p is None:  # paper: U{1, len(doc 0)}, shared by every document
        p = int(ctx.rng("prefix").integers(1, docs[0] + 1))
    return make_mask(
        ctx, "prefix_lm_document", heterogeneous.prefix_lm_document(docs, p), docs, distribution=dist, prefix=p
    )


PATTERN = MaskPattern(
    "prefix_lm_document",
    "heterogeneous",
    _prefix_lm_document,
    DOCUMENT_LOCAL_FORMS,
    (
        *DOC_PARAMS,
        Param("prefix", int, None, "prefix p per document (default: drawn from U{1, len(doc 0)})", minimum=0),
    ),
    multi_document=True,
    default_samples=30,
    description="per document: full prefix, causal rest",
    position=10,
)

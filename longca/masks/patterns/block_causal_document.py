"""Block-causal document: per document, blocks of B tokens see blocks 0..i."""

from __future__ import annotations

from longca.masks import heterogeneous
from longca.masks.mask import Mask
from longca.masks.pattern import (
    DOCUMENT_LOCAL_FORMS,
    LONG_FRACTION,
    BuildContext,
    MaskPattern,
    Param,
    check_distribution_or_blocks,
    draw_documents,
    make_mask,
)


def _block_causal_document(ctx: BuildContext) -> Mask:
    block = ctx.params["block"]
    if ctx.params["distribution"] == "blocks":  # paper: each document has U{1..max_blocks} blocks
        rng = ctx.rng("documents")
        docs_list, filled = [], 0
        while filled < ctx.seqlen:
            n = int(rng.integers(1, ctx.params["max_blocks"] + 1)) * block
            n = min(n, ctx.seqlen - filled)
            docs_list.append(n)
            filled += n
        docs, dist = tuple(docs_list), "blocks"
    else:
        docs, dist = draw_documents(ctx)
    return make_mask(
        ctx, "block_causal_document", heterogeneous.block_causal_document(docs, block), docs, distribution=dist
    )


PATTERN = MaskPattern(
    "block_causal_document",
    "heterogeneous",
    _block_causal_document,
    DOCUMENT_LOCAL_FORMS,
    (
        Param("block", int, 1024, "block size B in tokens (paper: 1024)", minimum=1),
        Param(
            "distribution",
            str,
            "blocks",
            "document lengths: blocks (paper: U{1..max_blocks} blocks of B) or any document distribution",
            check=check_distribution_or_blocks,
        ),
        Param("max_blocks", int, 8, "most blocks per document when distribution=blocks (paper: 8)", minimum=1),
        LONG_FRACTION,
    ),
    multi_document=True,
    default_samples=30,
    description="per document, blocks of B see blocks 0..i",
    position=11,
    gallery=lambda s: {"block": max(1, s // 16)},
)

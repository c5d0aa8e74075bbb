"""Block sparse: b x b blocks, the top-k key blocks per query block and KV head."""

from __future__ import annotations

from longca.masks import block_sparse
from longca.masks.mask import Mask
from longca.masks.pattern import DENSITY, SCORE, SPARSE_FORMS, BuildContext, MaskPattern, Param, block_mask


def _block_sparse(ctx: BuildContext) -> Mask:
    b = ctx.params["block"]
    bounds = block_sparse.uniform_bounds(ctx.seqlen, b)
    return block_mask(ctx, "block_sparse", bounds, bounds, b)


PATTERN = MaskPattern(
    "block_sparse",
    "dynamic",
    _block_sparse,
    SPARSE_FORMS,
    (Param("block", int, 128, "block size b (paper: 64, 128)", minimum=1), DENSITY, SCORE),
    default_samples=2,
    description="b x b blocks, top-k key blocks per query block and KV head",
    position=12,
    gallery=lambda s: {"block": max(1, s // 32)},
)

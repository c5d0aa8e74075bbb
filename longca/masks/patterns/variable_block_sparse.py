"""Variable block sparse: blocks of varying sizes, the top-k key blocks per query block and KV head."""

from __future__ import annotations

from longca.masks import block_sparse
from longca.masks.mask import Mask
from longca.masks.pattern import DENSITY, SCORE, SPARSE_FORMS, BuildContext, MaskPattern, Param, block_mask


def _variable_block_sparse(ctx: BuildContext) -> Mask:
    rng = ctx.rng("block_sizes")
    lo, mean = ctx.params["min_block"], ctx.params["mean_block"]
    qb = block_sparse.variable_bounds(ctx.seqlen, lo, mean, rng)
    kb = block_sparse.variable_bounds(ctx.seqlen, lo, mean, rng)
    return block_mask(ctx, "variable_block_sparse", qb, kb, None)


PATTERN = MaskPattern(
    "variable_block_sparse",
    "dynamic",
    _variable_block_sparse,
    SPARSE_FORMS,
    (
        Param("min_block", int, 128, "smallest block (paper: 128)", minimum=1),
        Param("mean_block", int, 512, "mean block size (paper: 128 to 1024)", minimum=1),
        DENSITY,
        SCORE,
    ),
    default_samples=2,
    description="blocks of varying sizes, top-k per query block and KV head",
    position=13,
    gallery=lambda s: {"min_block": max(1, s // 64), "mean_block": max(1, s // 16)},
)

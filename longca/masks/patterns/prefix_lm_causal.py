"""Prefix-LM causal: full over [0, p), causal after (paper: p drawn from U{1, S})."""

from __future__ import annotations

from longca.masks import heterogeneous
from longca.masks.mask import Mask
from longca.masks.pattern import GENERIC_FORMS, BuildContext, MaskPattern, Param, make_mask


def _prefix_lm_causal(ctx: BuildContext) -> Mask:
    p = ctx.params["prefix"]
    if p is None:  # paper: U{1, S}
        p = int(ctx.rng("prefix").integers(1, ctx.seqlen + 1))
    return make_mask(ctx, "prefix_lm_causal", heterogeneous.prefix_lm_causal(ctx.seqlen, p), prefix=p)


PATTERN = MaskPattern(
    "prefix_lm_causal",
    "heterogeneous",
    _prefix_lm_causal,
    GENERIC_FORMS,
    (Param("prefix", int, None, "prefix length p (default: drawn from U{1, S})", minimum=0),),
    default_samples=2,
    description="full over [0, p), causal after",
    position=9,
)

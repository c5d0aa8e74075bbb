"""Global sliding window: g global tokens plus |q - k| <= w (paper: w = g, drawn)."""

from __future__ import annotations

from longca.masks import heterogeneous
from longca.masks.mask import Mask
from longca.masks.pattern import GENERIC_FORMS, BuildContext, MaskPattern, Param, make_mask


def _global_sliding_window(ctx: BuildContext) -> Mask:
    g = ctx.params["global_tokens"]
    if g is None:  # paper: one value from U{1, S/3 - 1}, used for both g and w
        g = int(ctx.rng("global_tokens").integers(1, max(1, ctx.seqlen // 3 - 1) + 1))
    w = ctx.params["window"] if ctx.params["window"] is not None else g
    return make_mask(
        ctx, "global_sliding_window", heterogeneous.global_sliding_window(ctx.seqlen, g, w), global_tokens=g, window=w
    )


PATTERN = MaskPattern(
    "global_sliding_window",
    "heterogeneous",
    _global_sliding_window,
    GENERIC_FORMS,
    (
        Param("global_tokens", int, None, "global tokens g (default: drawn from U{1, S/3 - 1})", minimum=0),
        Param("window", int, None, "window w (default: equal to g, as the paper)", minimum=0),
    ),
    default_samples=2,
    description="g global tokens plus |q - k| <= w",
    position=8,
)

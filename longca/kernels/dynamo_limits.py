"""Dynamo's recompile limits, raised once for every compiled kernel of longca (Flex, the LSE
combination): each mask shape, length and block size is a recompile, and past dynamo's default
limit (8) a compiled function silently runs eagerly."""

from __future__ import annotations

# Shapes (and mask interval layer counts) each need their own compilation under dynamic=False;
# a sweep sees many, and falling back to eager flex (which materialises S x S scores) would be
# silently slow and memory-hungry, so the recompile limits are raised well above a sweep's count.
RECOMPILE_LIMIT = 4096


def raise_recompile_limits() -> None:
    """Dynamo's recompile limits up to RECOMPILE_LIMIT: past the default (8), dynamo silently runs
    a compiled function eagerly, which for Flex means S x S scores (seen as CP `oom` rows on the H200)."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))

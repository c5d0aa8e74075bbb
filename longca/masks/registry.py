"""The mask patterns by name: each module of longca.masks.patterns holds one (its parameters,
builder and forms, longca.masks.pattern), so a new mask is one new file; a plugin module
(LONGCA_PLUGINS) may `register` its own.

`build_mask(name, seqlen, params, seed=, sample=)` is the one entry point. A pattern's sampled
parameters (document lengths, a prefix length, a global-token count, block scores) come from
generators seeded by (seed, sample, seqlen, stream), so the same call always gives the same mask;
document lengths use one stream shared by every document mask, so full_document and
causal_document of one (seed, sample) pack the same documents. Every sampled value is written
back into Mask.params, which result rows record.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import numpy as np

from longca.masks import patterns
from longca.masks.mask import Mask
from longca.masks.pattern import FAMILIES, BuildContext, MaskPattern

PATTERNS: dict[str, MaskPattern] = {}


def register(pattern: MaskPattern) -> MaskPattern:
    """Add a pattern (a plugin's): its name must be new and its family one of FAMILIES."""
    if pattern.family not in FAMILIES:
        raise ValueError(f"pattern {pattern.name!r}: family {pattern.family!r} not in {FAMILIES}")
    if pattern.name in PATTERNS:
        raise ValueError(f"mask {pattern.name!r} registered twice")
    PATTERNS[pattern.name] = pattern
    return pattern


def _discover() -> None:
    """Every module of longca.masks.patterns, in the patterns' positions (the paper's order)."""
    found = [
        importlib.import_module(f"{patterns.__name__}.{m.name}").PATTERN
        for m in pkgutil.iter_modules(patterns.__path__)
    ]
    for pattern in sorted(found, key=lambda p: (p.position, p.name)):
        register(pattern)


_discover()
STATIC = tuple(n for n, p in PATTERNS.items() if p.family != "dynamic")


def resolve_params(name: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Defaults filled in, values checked, unknown keys rejected with the allowed ones named."""
    if name not in PATTERNS:
        raise ValueError(f"unknown mask {name!r}; allowed: {sorted(PATTERNS)}")
    pat = PATTERNS[name]
    params = dict(params or {})
    allowed = {p.name for p in pat.params}
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(f"mask {name!r}: unknown parameter(s) {sorted(unknown)}; allowed: {sorted(allowed) or 'none'}")
    return {p.name: p.coerce(name, params.get(p.name, p.default)) for p in pat.params}


def build_mask(
    name: str,
    seqlen: int,
    params: dict[str, Any] | None = None,
    *,
    seed: int = 0,
    sample: int = 0,
    inputs: tuple[Any, Any] | None = None,
    heads_kv: int | None = None,
) -> Mask:
    """Build one sample of a mask. The same (name, seqlen, params, seed, sample) gives the same mask.

    `inputs=(q, k)` (bshd torch tensors) are needed only by importance-scored block sparsity;
    `heads_kv` (default: from the inputs, else 1) is the number of per-head layouts it builds.
    """
    if isinstance(seqlen, bool) or not isinstance(seqlen, (int, np.integer)) or seqlen < 1:
        raise ValueError(f"seqlen={seqlen!r} is invalid; allowed: an integer >= 1")
    resolved = resolve_params(name, params)
    if heads_kv is None:
        heads_kv = int(inputs[1].shape[2]) if inputs is not None else 1
    if heads_kv < 1:
        raise ValueError(f"heads_kv={heads_kv!r} is invalid; allowed: an integer >= 1")
    ctx = BuildContext(int(seqlen), resolved, seed=seed, sample=sample, heads_kv=heads_kv, inputs=inputs)
    return PATTERNS[name].build(ctx)

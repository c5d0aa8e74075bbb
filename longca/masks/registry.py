"""Mask patterns by name: parameters, the forms each can be given to kernels, and factories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from longca.masks import regular
from longca.masks.documents import sample_documents
from longca.masks.mask import Mask


@dataclass(frozen=True)
class Param:
    name: str
    type: type
    default: Any
    help: str = ""
    minimum: float | None = None
    choices: tuple | None = None


@dataclass(frozen=True)
class MaskPattern:
    name: str
    family: str  # regular | heterogeneous | dynamic
    build: Callable[[int, dict[str, Any], np.random.Generator], Mask]
    forms: frozenset[str]
    params: tuple[Param, ...] = ()
    multi_document: bool = False
    description: str = ""
    needs_inputs: bool = False  # importance-scored block sparsity reads q and k
    default_samples: int = field(default=2)


PATTERNS: dict[str, MaskPattern] = {}

GENERIC_FORMS = frozenset({"dense", "blockmask", "slices"})
DOC_PARAMS = (Param("distribution", str, "uniform", "document length distribution"),)


def register(pattern: MaskPattern) -> MaskPattern:
    PATTERNS[pattern.name] = pattern
    return pattern


def _docs(seqlen: int, params: dict, rng: np.random.Generator) -> tuple[int, ...]:
    return sample_documents(seqlen, params["distribution"], rng)


def _mk(name, seqlen, slices, params, documents=None) -> Mask:
    return Mask(name=name, seqlen_q=seqlen, seqlen_k=seqlen, slices=slices, params=params, documents=documents)


register(MaskPattern(
    "full", "regular", lambda s, p, r: _mk("full", s, regular.full(s, s), p),
    GENERIC_FORMS | {"full"}, description="every query attends every key"))
register(MaskPattern(
    "causal", "regular", lambda s, p, r: _mk("causal", s, regular.causal(s, s), p),
    GENERIC_FORMS | {"causal"}, description="k <= q"))


def _full_document(s, p, r):
    d = _docs(s, p, r)
    return _mk("full_document", s, regular.full_document(d), p, d)


def _causal_document(s, p, r):
    d = _docs(s, p, r)
    return _mk("causal_document", s, regular.causal_document(d), p, d)


register(MaskPattern("full_document", "regular", _full_document, GENERIC_FORMS | {"varlen"}, DOC_PARAMS,
                     multi_document=True, default_samples=30, description="block diagonal over documents"))
register(MaskPattern("causal_document", "regular", _causal_document, GENERIC_FORMS | {"varlen"}, DOC_PARAMS,
                     multi_document=True, default_samples=30, description="same document and k <= q"))
WINDOW = (Param("window", int, 1024, "window w: |q - k| <= w", minimum=0),)
register(MaskPattern(
    "sliding_window", "regular",
    lambda s, p, r: _mk("sliding_window", s, regular.sliding_window(s, p["window"]), p),
    GENERIC_FORMS | {"window"}, WINDOW, description="|q - k| <= w"))
register(MaskPattern(
    "causal_sliding_window", "regular",
    lambda s, p, r: _mk("causal_sliding_window", s, regular.causal_sliding_window(s, p["window"]), p),
    GENERIC_FORMS | {"window"}, WINDOW, description="0 <= q - k <= w"))


def resolve_params(name: str, params: dict[str, Any] | None) -> dict[str, Any]:
    """Defaults filled in, unknown keys rejected with the allowed ones named."""
    if name not in PATTERNS:
        raise ValueError(f"unknown mask {name!r}; allowed: {sorted(PATTERNS)}")
    pat = PATTERNS[name]
    params = dict(params or {})
    allowed = {p.name for p in pat.params}
    unknown = set(params) - allowed
    if unknown:
        raise ValueError(f"mask {name!r}: unknown parameter(s) {sorted(unknown)}; allowed: {sorted(allowed) or 'none'}")
    out = {}
    for p in pat.params:
        out[p.name] = params.get(p.name, p.default)
    return out


def build_mask(name: str, seqlen: int, params: dict[str, Any] | None = None, *, seed: int = 0,
               sample: int = 0) -> Mask:
    """Build one sample of a mask. The same (name, seqlen, params, seed, sample) gives the same mask."""
    resolved = resolve_params(name, params)
    rng = np.random.default_rng([seed, sample, seqlen, _stable_hash(name)])
    return PATTERNS[name].build(seqlen, resolved, rng)


def _stable_hash(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())

"""The 14 mask patterns by name: parameters, the forms each can be given to kernels, and builders.

`build_mask(name, seqlen, params, seed=, sample=)` is the one entry point. A pattern's sampled
parameters (document lengths, a prefix length, a global-token count, block scores) come from
generators seeded by (seed, sample, seqlen, stream), so the same call always gives the same mask;
document lengths use one stream shared by every document mask, so full_document and
causal_document of one (seed, sample) pack the same documents. Every sampled value is written
back into Mask.params, which result rows record.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longca.masks import block_sparse, distributions, heterogeneous, regular
from longca.masks.documents import sample_documents
from longca.masks.mask import Mask

FAMILIES = ("regular", "heterogeneous", "dynamic")


@dataclass(frozen=True)
class Param:
    """One mask parameter. `default=None` on a sampled parameter means "draw it as the paper did"."""

    name: str
    type: type
    default: Any
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple | None = None
    check: Callable[[Any], None] | None = None  # extra validation; raises ValueError

    def coerce(self, mask: str, value: Any) -> Any:
        def bad(allowed: str) -> ValueError:
            return ValueError(f"mask {mask!r}: parameter {self.name!r} = {value!r} is invalid; allowed: {allowed}")

        if value is None:
            if self.default is None:
                return None
            raise bad(f"a {self.type.__name__}")
        if self.type is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise bad("an integer")
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise bad("an integer") from None
        elif self.type is float:
            if isinstance(value, bool):
                raise bad("a number")
            try:
                value = float(value)
            except (TypeError, ValueError):
                raise bad("a number") from None
        elif self.type is str:
            if not isinstance(value, str):
                raise bad("a string")
        if self.choices is not None and value not in self.choices:
            raise bad(str(list(self.choices)))
        if self.minimum is not None and value < self.minimum:
            raise bad(f">= {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise bad(f"<= {self.maximum}")
        if self.check is not None:
            try:
                self.check(value)
            except ValueError as exc:
                raise ValueError(f"mask {mask!r}: parameter {self.name!r}: {exc}") from None
        return value


@dataclass(frozen=True)
class BuildContext:
    """What a builder gets: the length, resolved parameters, seeds and (optionally) the inputs."""

    seqlen: int
    params: dict[str, Any]
    seed: int = 0
    sample: int = 0
    heads_kv: int = 1
    inputs: tuple[Any, Any] | None = None  # (q, k) torch tensors, bshd

    def rng(self, stream: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.sample, self.seqlen, zlib.crc32(stream.encode())])


@dataclass(frozen=True)
class MaskPattern:
    name: str
    family: str  # regular | heterogeneous | dynamic
    build: Callable[[BuildContext], Mask]
    forms: frozenset[str]
    params: tuple[Param, ...] = ()
    multi_document: bool = False
    description: str = ""
    # Samples per cell by default (paper: 30 for multi-document masks, 2 for single-sequence
    # ones); a mask with nothing to sample is identical every time, so one sample suffices.
    default_samples: int = field(default=1)

    @property
    def sampled(self) -> bool:
        """True when building draws something (documents, a length, scores): samples differ."""
        return self.default_samples > 1

    def needs_inputs_for(self, params: dict[str, Any]) -> bool:
        """Whether building needs the cell's (q, k): dynamic masks scored by importance only."""
        return self.family == "dynamic" and params.get("score") == "importance"


PATTERNS: dict[str, MaskPattern] = {}

GENERIC_FORMS = frozenset({"dense", "blockmask", "slices", "intervals"})


def register(pattern: MaskPattern) -> MaskPattern:
    if pattern.family not in FAMILIES:
        raise ValueError(f"pattern {pattern.name!r}: family {pattern.family!r} not in {FAMILIES}")
    PATTERNS[pattern.name] = pattern
    return pattern


def _check_distribution(value: str) -> None:
    distributions.resolve(value, 1)


def _check_distribution_or_blocks(value: str) -> None:
    if value != "blocks":
        _check_distribution(value)


DISTRIBUTION = Param(
    "distribution",
    str,
    "auto",
    "document lengths: auto (by S, as the paper), uniform, pile, prolong-64k, prolong-512k or file:<path>",
    check=_check_distribution,
)
LONG_FRACTION = Param(
    "long_fraction",
    float,
    0.0,
    "fraction of tokens in U[8K, 30K] documents (paper's distributed runs: 0.6)",
    minimum=0.0,
    maximum=1.0,
)
DOC_PARAMS = (DISTRIBUTION, LONG_FRACTION)
WINDOW = Param("window", int, 1024, "window w: |q - k| <= w (paper: 1024)", minimum=0)
DENSITY = Param(
    "density",
    float,
    0.5,
    "fraction of key blocks kept per query block (paper: 0.2, 0.5, 0.8)",
    minimum=1e-9,
    maximum=1.0,
)
SCORE = Param(
    "score",
    str,
    "random",
    "block scores: random (paper) or importance (mean-pooled q.k)",
    choices=block_sparse.SCORE_SOURCES,
)


def _mk(ctx: BuildContext, name: str, slices: np.ndarray, documents=None, **extra) -> Mask:
    params = {**ctx.params, **extra}
    return Mask(
        name=name,
        seqlen_q=ctx.seqlen,
        seqlen_k=ctx.seqlen,
        slices=slices,
        params=params,
        documents=None if documents is None else tuple(int(d) for d in documents),
    )


def _documents(ctx: BuildContext) -> tuple[tuple[int, ...], str]:
    dist = distributions.resolve(ctx.params["distribution"], ctx.seqlen)
    docs = sample_documents(ctx.seqlen, dist, ctx.rng("documents"), long_fraction=ctx.params["long_fraction"])
    return docs, dist


def _doc_pattern(
    name: str,
    family: str,
    slices_of: Callable[[tuple[int, ...]], np.ndarray],
    description: str,
    forms: frozenset[str] = GENERIC_FORMS,
) -> MaskPattern:
    def build(ctx: BuildContext) -> Mask:
        docs, dist = _documents(ctx)
        return _mk(ctx, name, slices_of(docs), docs, distribution=dist)

    return register(
        MaskPattern(
            name, family, build, forms, DOC_PARAMS, multi_document=True, default_samples=30, description=description
        )
    )


# ---- regular (6) ---------------------------------------------------------------------------------

register(
    MaskPattern(
        "full",
        "regular",
        lambda c: _mk(c, "full", regular.full(c.seqlen, c.seqlen)),
        GENERIC_FORMS | {"full", "varlen", "window"},
        description="every query attends every key",
    )
)
register(
    MaskPattern(
        "causal",
        "regular",
        lambda c: _mk(c, "causal", regular.causal(c.seqlen, c.seqlen)),
        GENERIC_FORMS | {"causal", "varlen", "window"},
        description="k <= q",
    )
)
# masks whose every pair lies inside one document: each document is a sequence of its own
DOCUMENT_LOCAL_FORMS = GENERIC_FORMS | {"document_intervals"}
_doc_pattern(
    "full_document",
    "regular",
    regular.full_document,
    "block diagonal over documents",
    DOCUMENT_LOCAL_FORMS | {"varlen"},
)
_doc_pattern(
    "causal_document", "regular", regular.causal_document, "same document and k <= q", DOCUMENT_LOCAL_FORMS | {"varlen"}
)
register(
    MaskPattern(
        "sliding_window",
        "regular",
        lambda c: _mk(c, "sliding_window", regular.sliding_window(c.seqlen, c.params["window"])),
        GENERIC_FORMS | {"window"},
        (WINDOW,),
        description="|q - k| <= w",
    )
)
register(
    MaskPattern(
        "causal_sliding_window",
        "regular",
        lambda c: _mk(c, "causal_sliding_window", regular.causal_sliding_window(c.seqlen, c.params["window"])),
        GENERIC_FORMS | {"window"},
        (WINDOW,),
        description="0 <= q - k <= w",
    )
)

# ---- heterogeneous (6) ---------------------------------------------------------------------------

_doc_pattern(
    "share_question",
    "heterogeneous",
    heterogeneous.share_question,
    "document 0 is a question; later documents see it fully and themselves causally",
)
_doc_pattern(
    "causal_blockwise",
    "heterogeneous",
    heterogeneous.causal_blockwise,
    "documents causal on themselves; the last sees every earlier token",
)


def _global_sliding_window(ctx: BuildContext) -> Mask:
    g = ctx.params["global_tokens"]
    if g is None:  # paper: one value from U{1, S/3 - 1}, used for both g and w
        g = int(ctx.rng("global_tokens").integers(1, max(1, ctx.seqlen // 3 - 1) + 1))
    w = ctx.params["window"] if ctx.params["window"] is not None else g
    return _mk(
        ctx, "global_sliding_window", heterogeneous.global_sliding_window(ctx.seqlen, g, w), global_tokens=g, window=w
    )


register(
    MaskPattern(
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
    )
)


def _prefix_lm_causal(ctx: BuildContext) -> Mask:
    p = ctx.params["prefix"]
    if p is None:  # paper: U{1, S}
        p = int(ctx.rng("prefix").integers(1, ctx.seqlen + 1))
    return _mk(ctx, "prefix_lm_causal", heterogeneous.prefix_lm_causal(ctx.seqlen, p), prefix=p)


register(
    MaskPattern(
        "prefix_lm_causal",
        "heterogeneous",
        _prefix_lm_causal,
        GENERIC_FORMS,
        (Param("prefix", int, None, "prefix length p (default: drawn from U{1, S})", minimum=0),),
        default_samples=2,
        description="full over [0, p), causal after",
    )
)


def _prefix_lm_document(ctx: BuildContext) -> Mask:
    docs, dist = _documents(ctx)
    p = ctx.params["prefix"]
    if p is None:  # paper: U{1, len(doc 0)}, shared by every document
        p = int(ctx.rng("prefix").integers(1, docs[0] + 1))
    return _mk(ctx, "prefix_lm_document", heterogeneous.prefix_lm_document(docs, p), docs, distribution=dist, prefix=p)


register(
    MaskPattern(
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
    )
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
        docs, dist = _documents(ctx)
    return _mk(ctx, "block_causal_document", heterogeneous.block_causal_document(docs, block), docs, distribution=dist)


register(
    MaskPattern(
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
                check=_check_distribution_or_blocks,
            ),
            Param("max_blocks", int, 8, "most blocks per document when distribution=blocks (paper: 8)", minimum=1),
            LONG_FRACTION,
        ),
        multi_document=True,
        default_samples=30,
        description="per document, blocks of B see blocks 0..i",
    )
)

# ---- dynamic block-sparse (2) --------------------------------------------------------------------


def _block_mask(ctx: BuildContext, name: str, q_bounds, k_bounds, uniform_block, **extra) -> Mask:
    lay = block_sparse.layout(
        ctx.seqlen,
        q_bounds,
        k_bounds,
        density=ctx.params["density"],
        score=ctx.params["score"],
        heads_kv=ctx.heads_kv,
        rng=ctx.rng("scores"),
        inputs=ctx.inputs,
        uniform_block=uniform_block,
    )
    keep = block_sparse.keep_count(ctx.params["density"], len(k_bounds) - 1)
    params = {
        **ctx.params,
        **extra,
        "heads_kv": ctx.heads_kv,
        "kept_per_query_block": keep,
        "kept_fraction": keep / (len(k_bounds) - 1),
    }
    return Mask(
        name=name,
        seqlen_q=ctx.seqlen,
        seqlen_k=ctx.seqlen,
        slices=np.zeros((0, 5), dtype=np.int64),
        params=params,
        blocks=lay,
    )


def _block_sparse(ctx: BuildContext) -> Mask:
    b = ctx.params["block"]
    bounds = block_sparse.uniform_bounds(ctx.seqlen, b)
    return _block_mask(ctx, "block_sparse", bounds, bounds, b)


def _variable_block_sparse(ctx: BuildContext) -> Mask:
    rng = ctx.rng("block_sizes")
    lo, mean = ctx.params["min_block"], ctx.params["mean_block"]
    qb = block_sparse.variable_bounds(ctx.seqlen, lo, mean, rng)
    kb = block_sparse.variable_bounds(ctx.seqlen, lo, mean, rng)
    return _block_mask(ctx, "variable_block_sparse", qb, kb, None)


SPARSE_FORMS = frozenset({"dense", "blockmask", "block_sparse"})
register(
    MaskPattern(
        "block_sparse",
        "dynamic",
        _block_sparse,
        SPARSE_FORMS,
        (Param("block", int, 128, "block size b (paper: 64, 128)", minimum=1), DENSITY, SCORE),
        default_samples=2,
        description="b x b blocks, top-k key blocks per query block and KV head",
    )
)
register(
    MaskPattern(
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
    )
)

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

"""What a mask pattern is: its parameters, the context its builder gets, the forms it can be given
to kernels, and the parts patterns share (document sampling, block-sparse layouts, common
parameters). Each pattern is one module of longca.masks.patterns built from these; the registry
(longca.masks.registry) finds them.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longca.masks import block_sparse, distributions
from longca.masks.documents import sample_documents
from longca.masks.mask import Mask

FAMILIES = ("regular", "heterogeneous", "dynamic")
GENERIC_FORMS = frozenset({"dense", "blockmask", "slices", "intervals"})
# masks whose every pair lies inside one document: each document is a sequence of its own
DOCUMENT_LOCAL_FORMS = GENERIC_FORMS | {"document_intervals"}
SPARSE_FORMS = frozenset({"dense", "blockmask", "block_sparse"})


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
    # Where the pattern sits in lists (the paper's order); a new pattern goes last by default.
    position: float = math.inf
    # The "window" form: (left, right) keys around each query from the resolved parameters, -1
    # meaning unbounded (flash-attn's window_size); None where the pattern has no window form.
    window: Callable[[dict[str, Any]], tuple[int, int]] | None = None
    # Each document attends its own keys causally: what the varlen and document-interval forms'
    # offsets alone cannot say (the single-document full and causal masks are one document).
    causal_documents: bool = False
    # Parameters that make the structure visible at length S in the gallery (longca.masks.draw).
    gallery: Callable[[int], dict[str, Any]] | None = None

    @property
    def sampled(self) -> bool:
        """True when building draws something (documents, a length, scores): samples differ."""
        return self.default_samples > 1

    def needs_inputs_for(self, params: dict[str, Any]) -> bool:
        """Whether building needs the cell's (q, k): dynamic masks scored by importance only."""
        return self.family == "dynamic" and params.get("score") == "importance"


def check_distribution(value: str) -> None:
    distributions.resolve(value, 1)


def check_distribution_or_blocks(value: str) -> None:
    if value != "blocks":
        check_distribution(value)


DISTRIBUTION = Param(
    "distribution",
    str,
    "auto",
    "document lengths: auto (by S, as the paper), uniform, pile, prolong-64k, prolong-512k or file:<path>",
    check=check_distribution,
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


def make_mask(ctx: BuildContext, name: str, slices: np.ndarray, documents=None, **extra) -> Mask:
    params = {**ctx.params, **extra}
    return Mask(
        name=name,
        seqlen_q=ctx.seqlen,
        seqlen_k=ctx.seqlen,
        slices=slices,
        params=params,
        documents=None if documents is None else tuple(int(d) for d in documents),
    )


def draw_documents(ctx: BuildContext) -> tuple[tuple[int, ...], str]:
    dist = distributions.resolve(ctx.params["distribution"], ctx.seqlen)
    docs = sample_documents(ctx.seqlen, dist, ctx.rng("documents"), long_fraction=ctx.params["long_fraction"])
    return docs, dist


def document_pattern(
    name: str,
    family: str,
    slices_of: Callable[[tuple[int, ...]], np.ndarray],
    description: str,
    forms: frozenset[str] = GENERIC_FORMS,
    **fields: Any,
) -> MaskPattern:
    """A pattern over sampled documents (paper: 30 samples), its slices a function of their lengths."""

    def build(ctx: BuildContext) -> Mask:
        docs, dist = draw_documents(ctx)
        return make_mask(ctx, name, slices_of(docs), docs, distribution=dist)

    return MaskPattern(
        name,
        family,
        build,
        forms,
        DOC_PARAMS,
        multi_document=True,
        default_samples=30,
        description=description,
        **fields,
    )


def block_mask(ctx: BuildContext, name: str, q_bounds, k_bounds, uniform_block, **extra) -> Mask:
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

"""How far one cell's median moves between runs: the term a row's own interval leaves out.

A row's 95% interval (`ci_low_ms`, `ci_high_ms`) is the uncertainty of its median within one run on
one machine. Two runs of the same cell, on two leases of one GPU type, differ by more: the SM clock
a GPU holds under load differs between leases (power cap, temperature), and every cell of a run
moves with it; a call of under a millisecond is mostly the host's work (Python, launches), which
another lease's host does at its own pace. Given the rows of cells measured in more than one run
(same cell digest and mask draw), `between_runs` pairs every two runs of a cell and measures how
far apart their medians are, max / min - 1 (one is 1 + d times the other): the median and the 95th
percentile of that over the pairs (an order statistic, no distribution assumed), over all pairs and
per time scale (`SCALE_EDGES_MS`: a pair belongs to the scale of its shorter median). The Choose
page calls a lead between two kernels measured in different runs clear only when their intervals
stay apart by more than the runner-up's scale's 95th percentile.

A row's re-run interval (`rerun_interval`) is where a re-run of its cell on another lease should
land: its own 95% interval, widened on each side to the 95th percentile of the moves of its time
scale (`BetweenRuns.p95_at`). The report shows it beside the row's own interval, and `longca
compare --reruns` counts the new medians inside it, so a re-run on a fresh machine tests it against
moves measured before that re-run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from longca.report import queries
from longca.vocab import Status, Time

_KEYS = ("cell_digest", "mask_sample")

# Where the time scales part (ms). In the re-runs of the H200 set, pairs under 1 ms moved by 37%
# (median of 37 pairs; up to 2.3x) while the forward calls among them, replayed from a CUDA graph,
# moved by at most 9%: host time, which each lease's host spends at its own pace. From 10 ms the
# pairs moved by 1.6% (95th percentile 3.7%), with the SM clock (results/h200/README.md).
SCALE_EDGES_MS = (1.0, 10.0)
# A 95th percentile of fewer pairs is their largest move, not an estimate: such a scale's rows take
# the widest move measured at any scale.
MIN_PAIRS = 20


@dataclass(frozen=True)
class ScaleMoves:
    """The moves of the pairs whose shorter median lies in [low_ms, high_ms)."""

    low_ms: float
    high_ms: float
    pairs: int
    median: float
    p95: float

    def label(self) -> str:
        if self.low_ms == 0:
            return f"under {self.high_ms:g} ms"
        if math.isinf(self.high_ms):
            return f"from {self.low_ms:g} ms"
        return f"{self.low_ms:g}-{self.high_ms:g} ms"


@dataclass(frozen=True)
class BetweenRuns:
    """How far apart one cell's medians lie between runs, over every pair of runs: over all pairs
    and per time scale (`scales`: only the scales that have pairs, shortest first)."""

    pairs: int
    cells: int
    runs: int
    median: float
    p95: float
    scales: tuple[ScaleMoves, ...] = ()

    @property
    def widest(self) -> float:
        return max((s.p95 for s in self.scales), default=self.p95)

    def used(self, scale: ScaleMoves | None) -> float:
        """The move a scale's rows are widened by: its p95 from MIN_PAIRS pairs on, else (fewer
        pairs, or none: `scale` None) the widest measured move (no narrower claim than the data allow)."""
        return scale.p95 if scale is not None and scale.pairs >= MIN_PAIRS else self.widest

    def p95_at(self, median_ms: pl.Expr) -> pl.Expr:
        """Per row, the move its time scale's rows are widened by (`used`)."""
        out: pl.Expr = pl.lit(self.used(None))
        for s in reversed(self.scales):
            out = pl.when((median_ms >= s.low_ms) & (median_ms < s.high_ms)).then(pl.lit(self.used(s))).otherwise(out)
        return out

    def scale_of(self, median_ms: float) -> ScaleMoves | None:
        """The measured scale `median_ms` lies in; None where that scale has no pairs."""
        return next((s for s in self.scales if s.low_ms <= median_ms < s.high_ms), None)

    def sentence(self) -> str:
        parts = "; ".join(
            f"{s.label()}: {s.median:.1%} (median) and at most {s.p95:.1%} in 95% of {s.pairs} pairs"
            for s in self.scales
        )
        return (
            f"one cell's median moved by {self.median:.1%} (median) and at most {self.p95:.1%} "
            f"in 95% of {self.pairs} pairs ({self.cells} cells measured in two or more of {self.runs} runs); "
            f"by the shorter median of a pair, {parts}"
        )


def _p95(d: list[float]) -> float:
    return d[max(0, math.ceil(0.95 * len(d)) - 1)]


# the median each time is measured by: the eager call's, or the CUDA-graph replay's
_MEDIAN_AT = {Time.EAGER: "median_ms", Time.KERNEL: "graph_median_ms"}


def between_runs(*frames: pl.DataFrame, time: Time = Time.EAGER) -> BetweenRuns | None:
    """Pairs of ok rows of one cell and draw from two different runs (`run_id`) among the rows of
    `frames` (e.g. the published rows and the earlier runs of some of their cells), and the spread of
    how far apart their medians are (max / min - 1); None without any such pair. At `Time.KERNEL`
    the medians are the graph replays' (`graph_median_ms`): only pairs replayed in both runs count."""
    median = _MEDIAN_AT[time]
    need = {"run_id", median, "status", "mask_sample"}
    frames = tuple(
        f.select(
            # a cell is its digest; rows without one (written before digests) by their cell id
            pl.coalesce([pl.col(c) for c in ("cell_digest", "cell_id") if c in f.columns]).alias("cell_digest"),
            pl.col("mask_sample").fill_null(0),
            "run_id",
            pl.col(median).alias("median_ms"),
            "status",
        )
        for f in frames
        if not f.is_empty() and need <= set(f.columns) and {"cell_digest", "cell_id"} & set(f.columns)
    )
    if not frames:
        return None
    ok = (
        pl.concat(frames, how="vertical_relaxed")
        .filter(
            (pl.col("status") == Status.OK)
            & (pl.col("median_ms") > 0)
            & pl.col("median_ms").is_not_null()
            & pl.col("cell_digest").is_not_null()
        )
        .group_by([*_KEYS, "run_id"])
        .agg(pl.col("median_ms").first())  # a run holds one row per cell and draw
    )
    pairs = ok.join(ok, on=list(_KEYS), suffix="_b").filter(pl.col("run_id") < pl.col("run_id_b"))
    if pairs.is_empty():
        return None
    shorter = pl.min_horizontal("median_ms", "median_ms_b")
    pairs = pairs.with_columns(d=pl.max_horizontal("median_ms", "median_ms_b") / shorter - 1, shorter=shorter).sort("d")
    d = pairs.get_column("d").to_list()
    edges = (0.0, *SCALE_EDGES_MS, math.inf)
    found = []
    for low, high in zip(edges, edges[1:]):
        ds = pairs.filter((pl.col("shorter") >= low) & (pl.col("shorter") < high)).get_column("d").to_list()
        if ds:
            found.append((low, high, ds))
    scales = [ScaleMoves(low, high, len(ds), float(pl.Series(ds).median()), float(_p95(ds))) for low, high, ds in found]
    return BetweenRuns(
        pairs=len(d),
        cells=pairs.select(pl.col("cell_digest").n_unique()).item(),
        runs=pl.concat([pairs.get_column("run_id"), pairs.get_column("run_id_b")]).n_unique(),
        median=float(pl.Series(d).median()),
        p95=float(_p95(d)),
        scales=tuple(scales),
    )


def move_at(time: Time, eager: BetweenRuns | None, replayed: BetweenRuns | None) -> float | pl.Expr:
    """Per cell drawn at `time` (queries.at_time), the move between runs its median is widened by,
    read on its own row: at eager time its eager median's scale in `eager`; at kernel time a replayed
    cell's (`timing` "graph replay") its replay median's scale in `replayed`, where replays were
    paired at all, else (every other cell, or no replayed pair) its eager median's. 0 where no move
    was measured (`eager` None)."""
    if eager is None:
        return 0.0
    at_eager = eager.p95_at(pl.col("median_ms"))
    if time == Time.EAGER or replayed is None:
        return at_eager
    replay = pl.col("timing") == queries.REPLAYED
    return pl.when(replay).then(replayed.p95_at(pl.col("graph_median_ms"))).otherwise(at_eager)


def rerun_interval(p95: float | pl.Expr, median: pl.Expr, low: pl.Expr, high: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(low, high) of the re-run interval: the interval [`low`, `high`] of a `median` (a time or a
    rate alike), widened to where a move of `p95` (a number, or per row `BetweenRuns.p95_at`) puts a
    re-run's median: [median / (1 + p95), median * (1 + p95)]. Never narrower than the row's own."""
    if not isinstance(p95, pl.Expr):
        if not (math.isfinite(p95) and p95 >= 0):
            raise ValueError(f"p95 {p95}: allowed: a move of 0 or more (0.05: one median 1.05 times the other)")
        p95 = pl.lit(p95)
    return pl.min_horizontal(low, median / (1 + p95)), pl.max_horizontal(high, median * (1 + p95))

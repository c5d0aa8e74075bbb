"""How far one cell's median moves between runs: the term a row's own interval leaves out.

A row's 95% interval (`ci_low_ms`, `ci_high_ms`) is the uncertainty of its median within one run on
one machine. Two runs of the same cell, on two leases of one GPU type, differ by more: the SM clock
a GPU holds under load differs between leases (power cap, temperature), and every cell of a run
moves with it. Given the rows of cells measured in more than one run (same cell digest and mask
draw), `between_runs` pairs every two runs of a cell and measures the relative difference of their
medians, |a / b - 1|: its median and its 95th percentile over the pairs (an order statistic, no
distribution assumed). The Choose page calls a lead between two kernels measured in different runs
clear only when their intervals stay apart by more than that 95th percentile.

A row's re-run interval (`rerun_interval`) is where a re-run of its cell on another lease should
land: its own 95% interval, widened on each side to that 95th percentile of the moves. The report
shows it beside the row's own interval, and `longca compare --reruns` counts the new medians
inside it, so a re-run on a fresh machine tests it against moves measured before that re-run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from longca.vocab import Status

_KEYS = ("cell_digest", "mask_sample")


@dataclass(frozen=True)
class BetweenRuns:
    """The relative differences of one cell's medians between runs, over every pair of runs."""

    pairs: int
    cells: int
    runs: int
    median: float
    p95: float

    def sentence(self) -> str:
        return (
            f"one cell's median moved by {self.median:.1%} (median) and at most {self.p95:.1%} "
            f"in 95% of {self.pairs} pairs ({self.cells} cells measured in two or more of {self.runs} runs)"
        )


def between_runs(*frames: pl.DataFrame) -> BetweenRuns | None:
    """Pairs of ok rows of one cell and draw from two different runs (`run_id`) among the rows of
    `frames` (e.g. the published rows and the earlier runs of some of their cells), and the spread of
    their medians' relative difference; None without any such pair."""
    need = {"run_id", "median_ms", "status", "mask_sample"}
    frames = tuple(
        f.select(
            # a cell is its digest; rows without one (written before digests) by their cell id
            pl.coalesce([pl.col(c) for c in ("cell_digest", "cell_id") if c in f.columns]).alias("cell_digest"),
            pl.col("mask_sample").fill_null(0),
            "run_id",
            "median_ms",
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
            (pl.col("status") == Status.OK) & pl.col("median_ms").is_not_null() & pl.col("cell_digest").is_not_null()
        )
        .group_by([*_KEYS, "run_id"])
        .agg(pl.col("median_ms").first())  # a run holds one row per cell and draw
    )
    pairs = ok.join(ok, on=list(_KEYS), suffix="_b").filter(pl.col("run_id") < pl.col("run_id_b"))
    if pairs.is_empty():
        return None
    diff = (pl.col("median_ms") / pl.col("median_ms_b") - 1).abs()
    d = pairs.select(diff.alias("d")).get_column("d").sort().to_list()
    p95 = d[max(0, math.ceil(0.95 * len(d)) - 1)]
    return BetweenRuns(
        pairs=len(d),
        cells=pairs.select(pl.col("cell_digest").n_unique()).item(),
        runs=pl.concat([pairs.get_column("run_id"), pairs.get_column("run_id_b")]).n_unique(),
        median=float(pl.Series(d).median()),
        p95=float(p95),
    )


def rerun_interval(
    p95: float, median: pl.Expr, low: pl.Expr, high: pl.Expr, *, rate: bool = False
) -> tuple[pl.Expr, pl.Expr]:
    """(low, high) of the re-run interval: the interval [`low`, `high`] of a `median`, widened to
    where the 95th percentile `p95` of moves between runs puts a re-run's median. For a time, the
    median times [1 - p95, 1 + p95]; for a rate (`rate`: TFLOP/s, inverse to time), divided by
    [1 + p95, 1 - p95]. Never narrower than the row's own interval."""
    if not 0 <= p95 < 1:
        raise ValueError(f"p95 {p95}: allowed: a fraction in [0, 1)")
    down, up = (1 / (1 + p95), 1 / (1 - p95)) if rate else (1 - p95, 1 + p95)
    return pl.min_horizontal(low, median * down), pl.max_horizontal(high, median * up)

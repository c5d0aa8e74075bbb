"""The CP model's tables in the report: modelled per-GPU throughput at scale (longca model cp),
measured CP points beside it, and the model's validation table (longca model validate)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl

from longca.report.queries import length_label

VALIDATION_NUMERIC = ("world_size", "seqlen", "measured", "predicted", "error")


def load_models(paths: Sequence[str | Path]) -> pl.DataFrame:
    """Model tables (source = model) stacked; a table that is not one is refused by name."""
    frames = []
    for p in paths:
        df = pl.read_parquet(p)
        if "source" not in df.columns or set(df.get_column("source").unique()) != {"model"}:
            raise ValueError(f"--model {p}: not a model table (written by `longca model cp`: source = model)")
        frames.append(df)
    return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()


def best_variants(model: pl.DataFrame) -> pl.DataFrame:
    """Each mechanism at its fastest modelled variant (degrees, windows) per cluster, sweep, mask,
    pass and world size, with a panel label naming the mask and the tokens per GPU."""
    ok = model.filter(pl.col("status") == "ok")
    if ok.is_empty():
        return ok
    best = (
        ok.sort("tflops", descending=True)
        .group_by("cluster", "sweep", "mask", "pass", "world_size", "cp_mechanism", maintain_order=True)
        .first()
    )
    label = lambda col: pl.col(col).map_elements(length_label, pl.String)  # noqa: E731
    tokens = (
        best.group_by("cluster", "sweep", "mask")
        .agg(lo=pl.col("tokens_per_gpu").min(), hi=pl.col("tokens_per_gpu").max(), s=pl.col("seqlen_q").max())
        .with_columns(
            # a sweep at one tokens-per-GPU joins the others at the same (weak scaling: one panel)
            setting=pl.when(pl.col("lo") == pl.col("hi"))
            .then(pl.format("{} tokens/GPU", label("lo")))
            .otherwise(pl.format("S = {} ({}-{} tokens/GPU)", label("s"), label("lo"), label("hi")))
        )
    )
    return (
        best.join(tokens.select("cluster", "sweep", "mask", "setting"), on=["cluster", "sweep", "mask"])
        .with_columns(
            panel=pl.format("{} · {} · {}", "mask", "setting", "cluster"),
            series=pl.col("cp_mechanism"),
            label=pl.format("modelled ({})", pl.col("cp_variant")),
        )
        .sort("panel", "series", "world_size", "pass", "sweep")  # a total order: the same chart every build
    )


def measured_points(cp_cells: pl.DataFrame, lines: pl.DataFrame) -> pl.DataFrame:
    """Measured CP cells on the masks and passes the model draws, as points for every panel of
    that mask (their tokens per GPU in the label)."""
    if cp_cells.is_empty() or lines.is_empty():
        return pl.DataFrame()
    panels = lines.select("mask", "pass", "panel").unique(maintain_order=True)
    return (
        cp_cells.filter(pl.col("cp_mechanism").is_not_null())
        .join(panels, on=["mask", "pass"])
        .with_columns(
            series=pl.col("cp_mechanism"),
            label=pl.format(
                "measured on {} x {} ({} tokens/GPU)",
                "world_size",
                "device_name",
                (pl.col("seqlen_q") // pl.col("world_size")).map_elements(length_label, pl.String),
            ),
        )
        .sort("panel", "series", "world_size", "pass", "seqlen_q", "cell_key")
    )


def load_validation(path: str | Path) -> pl.DataFrame:
    return pl.read_csv(path)


def validation_summary(v: pl.DataFrame) -> pl.DataFrame:
    """Per check and pass: comparisons, median and largest |error|, how many within 15%."""
    return (
        v.with_columns(abs_error=pl.col("error").abs())
        .group_by("check", "pass", maintain_order=True)
        .agg(
            comparisons=pl.len(),
            median_abs_error=pl.col("abs_error").median(),
            max_abs_error=pl.col("abs_error").max(),
            within_15pct=(pl.col("abs_error") <= 0.15).sum(),
        )
    )

"""Every aggregation the report draws, as Polars queries over the conformed rows.

Rows are per measurement (a sampled mask gives one row per sample); charts draw *cells*: the rows
of one cell on one machine, summarised by the median. A cell is drawn only if every one of its
rows is ok: a cell with any failed sample is a non-ok cell, listed with its reasons, never a speed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import polars as pl

from longca.measure.stats import LONG_CALL_MS, min_samples, ranks
from longca.report.repro import selection_columns, with_selection_repro
from longca.vocab import Time

SPARSE_MASKS = ("block_sparse", "variable_block_sparse")
FAILED = ("error", "incorrect", "timeout")
# worst status wins when a cell's rows disagree
_STATUS_RANK = {"ok": 0, "unsupported": 1, "oom": 2, "timeout": 3, "incorrect": 4, "error": 5}
_RANK_STATUS = {v: k for k, v in _STATUS_RANK.items()}

# fields that define a cell when a row carries neither cell_digest nor cell_id
_DEFINING = (
    "spec",
    "sweep",
    "kernel",
    "pass",
    "batch",
    "seqlen_q",
    "seqlen_k",
    "heads_q",
    "heads_kv",
    "head_dim",
    "head_dim_v",
    "dtype",
    "layout",
    "mask",
    "distribution",
    "block_size",
    "score_source",
    "world_size",
    "cp_mechanism",
    "cp_degrees",
    "cp_balance",
)
_FIRST = (
    "spec",
    "sweep",
    "cell_id",
    "kernel",
    "kernel_family",
    "pass",
    "batch",
    "seqlen_q",
    "seqlen_k",
    "heads_q",
    "heads_kv",
    "head_dim",
    "head_dim_v",
    "dtype",
    "layout",
    "mask",
    "mask_family",
    "mask_variant",
    "mask_form",
    "distribution",
    "block_size",
    "score_source",
    "variable_blocks",
    "world_size",
    "cp_mechanism",
    "cp_degrees",
    "cp_balance",
    "cp_variant",
    "backend",
    "device",
    "device_name",
    "host",
    "attn",
    "shape",
    "machine",
    "mask_samples",
    "timer",
    "flop_model",
)
_MEDIAN = (
    "tflops",
    "tflops_kernel",
    "graph_median_ms",
    "tflops_ci_low",
    "tflops_ci_high",
    "tflops_kernel_ci_low",
    "tflops_kernel_ci_high",
    "tokens_per_s",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "flops",
    "mask_area",
    "density",
    "comm_exposed_ms",
    "comm_share",
    "imbalance_time",
    "imbalance_area",
    "rel_err_out",
    "clock_window_mhz",
)


def _machine() -> pl.Expr:
    """'device @ host': what keeps one cell's rows from different machines apart."""
    return pl.concat_str(
        [pl.col("device_name").fill_null("unknown device"), pl.lit(" @ "), pl.col("host").fill_null("unknown host")]
    )


def _with_sample_ci(rows: pl.DataFrame) -> pl.DataFrame:
    """Rows with `ci_low_ms`/`ci_high_ms` filled from their samples where they predate the stored
    interval (schema < 4): the same order statistics (longca.measure.stats), the ranks looked up
    once per sample count."""
    if "samples_ms" not in rows.columns or rows.height == 0:
        return rows
    n = pl.col("samples_ms").list.len()
    counts = [int(v) for v in rows.select(n.unique()).to_series().drop_nulls() if v]
    lows = {c: ranks(c)[0] - 1 for c in counts}
    highs = {c: ranks(c)[1] - 1 for c in counts}
    ordered = pl.col("samples_ms").list.sort()
    low = ordered.list.get(n.replace_strict(lows, default=None, return_dtype=pl.Int64), null_on_oob=True)
    high = ordered.list.get(n.replace_strict(highs, default=None, return_dtype=pl.Int64), null_on_oob=True)
    for name, expr in (("ci_low_ms", low), ("ci_high_ms", high)):
        rows = rows.with_columns(
            pl.coalesce(pl.col(name), expr).alias(name) if name in rows.columns else expr.alias(name)
        )
    return rows


def derive(rows: pl.DataFrame) -> pl.DataFrame:
    """Per-row columns the charts group by: attention type, shape label, machine, cell key, CP ratios."""
    hq, hkv = pl.col("heads_q"), pl.col("heads_kv")
    attn = pl.when(hq == hkv).then(pl.lit("MHA")).when(hkv == 1).then(pl.lit("MQA")).otherwise(pl.lit("GQA"))
    shape = pl.concat_str(
        [
            attn,
            pl.lit(" "),
            hq.cast(pl.String),
            pl.lit(":"),
            hkv.cast(pl.String),
            pl.lit(" D="),
            pl.col("head_dim").cast(pl.String),
            pl.lit(" "),
            pl.col("dtype"),
        ],
        ignore_nulls=True,
    )
    machine = _machine()
    fallback = pl.concat_str([pl.col(c).cast(pl.String).fill_null("") for c in _DEFINING], separator="|")
    rank_ms, rank_area = pl.col("rank_ms"), pl.col("rank_area").cast(pl.List(pl.Float64))
    return (
        _with_sample_ci(rows)
        .with_columns(
            attn=attn,
            shape=shape,
            machine=machine,
            cell_key=pl.coalesce(pl.col("cell_digest"), pl.col("cell_id"), fallback),
            world_size=pl.col("world_size").fill_null(1),
            kernel_family=pl.col("kernel_family").fill_null("softmax"),
            status_rank=pl.col("status").replace_strict(_STATUS_RANK, default=5, return_dtype=pl.Int8),
            comm_share=pl.col("comm_exposed_ms") / pl.col("median_ms"),
            imbalance_time=rank_ms.list.max() / rank_ms.list.mean(),
            imbalance_area=rank_area.list.max() / rank_area.list.mean(),
        )
        .with_columns(
            # the TFLOP/s interval of the time's 95% interval (its ends swap: less time, more TFLOP/s)
            tflops_ci_low=_tflops_at("ci_high_ms"),
            tflops_ci_high=_tflops_at("ci_low_ms"),
            # kernel time: the CUDA-graph replay's median where the call was captured (no host launch
            # time), else the eager median (`timing` says which); its interval likewise
            tflops_kernel=pl.coalesce(_tflops_at("graph_median_ms"), pl.col("tflops")),
            tflops_kernel_ci_low=pl.coalesce(_tflops_at("graph_ci_high_ms"), _tflops_at("ci_high_ms")),
            tflops_kernel_ci_high=pl.coalesce(_tflops_at("graph_ci_low_ms"), _tflops_at("ci_low_ms")),
        )
    )


def _tflops_at(ms: str) -> pl.Expr:
    """The row's TFLOP/s had its pass taken `ms` (a column of milliseconds) instead of its median."""
    return pl.col("tflops") * pl.col("median_ms") / pl.col(ms)


def supersede(rows: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(current rows, superseded rows): when a spec changes how a cell is measured (its `repeat`
    protocol, its check), the cell keeps its id but gets a new digest, and a rerun measures it again
    beside the old rows. Per (spec, sweep, cell id without its digest, machine) only the digest
    measured last is drawn; the earlier digests' rows are returned apart, for the Status page and
    the downloads, never for the charts. Rows without a cell id or digest are always current."""
    if not {"cell_id", "cell_digest", "timestamp"} <= set(rows.columns) or rows.height == 0:
        return rows, rows.clear()
    d = rows.with_columns(
        _ident=pl.col("cell_id").str.replace(r"@[0-9a-f]+$", ""),
        _machine=_machine(),
        _when=pl.col("timestamp").max().over("cell_digest"),
    )
    keyed = pl.col("cell_id").is_not_null() & pl.col("cell_digest").is_not_null()
    latest = (
        d.filter(keyed)
        .group_by("spec", "sweep", "_ident", "_machine")
        .agg(pl.col("cell_digest").sort_by("_when").last().alias("_keep"))
    )
    d = d.join(latest, on=["spec", "sweep", "_ident", "_machine"], how="left")
    old = keyed & pl.col("_keep").is_not_null() & (pl.col("cell_digest") != pl.col("_keep"))
    helpers = ["_ident", "_machine", "_when", "_keep"]
    return d.filter(~old).drop(helpers), d.filter(old).drop(helpers)


def outside_spec(rows: pl.DataFrame, spec_name: str, digests: set[str]) -> pl.DataFrame:
    """Per sweep of spec `spec_name`: the cells (and rows) whose digest the spec no longer has: measured
    under an earlier version of it (a changed protocol not yet measured again, or a cell it dropped)."""
    if rows.height == 0 or "cell_digest" not in rows.columns:
        return pl.DataFrame(schema={"sweep": pl.String, "cells": pl.UInt32, "rows": pl.UInt32})
    d = rows.filter(
        (pl.col("spec") == spec_name)
        & pl.col("cell_digest").is_not_null()
        & ~pl.col("cell_digest").is_in(list(digests))
    )
    return (
        d.group_by("sweep").agg(pl.col("cell_digest").n_unique().alias("cells"), pl.len().alias("rows")).sort("sweep")
    )


# a cell's `timing` where every draw was replayed from a CUDA graph
REPLAYED = "graph replay"


def first_time(c: pl.DataFrame) -> Time:
    """The time the report draws first: kernel time where any cell was replayed, else eager time
    (every time is eager where no cell was: on a CPU, say)."""
    return Time.KERNEL if c.filter(pl.col("timing") == REPLAYED).height else Time.EAGER


# the `graph_reason` of rows longca timed eagerly without trying a capture: backward cells measured
# before the backward capture existed, context-parallel cells (their collectives)
GRAPH_NOT_TRIED = "timed eagerly only"


def cells(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per (cell, machine): descriptive fields, medians over samples, the worst status."""
    d = derive(rows)
    return (
        d.group_by("cell_key", "machine", maintain_order=True)
        .agg(
            # a cell's rows agree on these, except where some leave a field empty (a failed row's backend)
            *[pl.col(c).drop_nulls().first() for c in _FIRST if c != "machine"],
            *[pl.col(c).median() for c in _MEDIAN],
            pl.col("peak_mem_bytes").max(),
            # the spread over mask draws (one row each), apart from each draw's timing interval
            # (whose median is tflops_ci_*): draw variance never enters the timing CI
            pl.col("tflops").min().alias("tflops_draw_low"),
            pl.col("tflops").max().alias("tflops_draw_high"),
            pl.col("tflops_kernel").min().alias("tflops_kernel_draw_low"),
            pl.col("tflops_kernel").max().alias("tflops_kernel_draw_high"),
            # which time `tflops_kernel` is: every draw replayed, or eager (a cell is never mixed)
            pl.when(pl.col("graph_median_ms").is_not_null().all())
            .then(pl.lit(REPLAYED))
            .otherwise(pl.lit("eager"))
            .alias("timing"),
            pl.col("graph_reason").drop_nulls().first().alias("graph_reason"),
            pl.col("status_rank").max().alias("worst"),
            (pl.col("status") == "ok").all().alias("all_ok"),
            pl.len().alias("rows"),
            pl.col("reason").drop_nulls().first().alias("reason"),
            pl.col("run_id").drop_nulls().unique().sort().str.join(", ").alias("run_ids"),
            # the commit(s) the cell was measured at: beside the repro command in every tooltip
            pl.col("git_commit").drop_nulls().unique().sort().str.join(", ").alias("git_commit"),
        )
        .with_columns(
            status=pl.col("worst").replace_strict(_RANK_STATUS, return_dtype=pl.String),
            peak_mem_gib=pl.col("peak_mem_bytes") / 2**30,
            # whether `tflops_kernel` is the kernel's time: a replay, or an eager time the protocol
            # kept as kernel time (a call too long for launches to matter; a pass that could not be
            # captured, whose launches a user capturing graphs pays too). Not so for cells measured
            # without `repeat.graph`, or eagerly only by a reason of longca's (GRAPH_NOT_TRIED).
            kernel_timed=(pl.col("timing") == REPLAYED)
            | (pl.col("graph_reason").is_not_null() & ~pl.col("graph_reason").str.contains(GRAPH_NOT_TRIED)),
        )
        .drop("worst")
        # the same rows in any file order give the same tables, chart data and downloads
        .sort("cell_key", "machine")
    )


def ok_cells(c: pl.DataFrame) -> pl.DataFrame:
    return c.filter(pl.col("all_ok"))


def _dense_softmax(c: pl.DataFrame) -> pl.DataFrame:
    """Single-device softmax kernels on the 12 non-sparse masks: what the per-mask pages compare."""
    return c.filter(
        (pl.col("world_size") == 1) & (pl.col("kernel_family") != "linear") & ~pl.col("mask").is_in(SPARSE_MASKS)
    )


def mask_cells(c: pl.DataFrame) -> pl.DataFrame:
    return _dense_softmax(ok_cells(c)).filter(pl.col("tflops").is_not_null())


def masks_with_rows(c: pl.DataFrame) -> list[str]:
    """Masks that get a page: any single-device softmax cell, ok or not, on a non-sparse mask."""
    return sorted(_dense_softmax(c).get_column("mask").drop_nulls().unique().to_list())


# what stays fixed while a shape study varies head dim and dtype; a sampled mask's cells compare only
# at the same number of draws (draw i is the same mask in every sweep of a spec: seed and index)
_SHAPE_FIXED = ["kernel", "mask", "mask_variant", "mask_samples", "pass", "seqlen_q", "heads_q", "heads_kv", "machine"]
_VARIANT = pl.struct("head_dim", "dtype")


def for_length_charts(cells: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(drawn against length, kept for the shape study): a kernel's cells at a head dim and dtype
    measured at one length only, on a panel (mask, attention type, machine) where the same kernel
    has another head dim or dtype at several lengths, are a head-dim or dtype study. Against length
    they would be lone points beside that kernel's line; the shapes page draws them instead."""
    panel = ["mask", "attn", "machine", "kernel"]
    d = cells.with_columns(_lengths=pl.col("seqlen_q").n_unique().over([*panel, "shape"]))
    d = d.with_columns(_lined=(pl.col("_lengths") > 1).any().over(panel))
    study = (pl.col("_lengths") == 1) & pl.col("_lined")
    return d.filter(~study).drop("_lengths", "_lined"), d.filter(study).drop("_lengths", "_lined")


def shape_study(c: pl.DataFrame) -> pl.DataFrame:
    """ok cells of one kernel, mask, pass, length and head counts at more than one (head dim, dtype),
    at the lengths with the most such variants on their machine: the head-dim and dtype comparison.
    Lengths where only two sweeps happen to meet (say one other head dim) are left out."""
    ok = mask_cells(c).with_columns(_variants=_VARIANT.n_unique().over(_SHAPE_FIXED)).filter(pl.col("_variants") > 1)
    if ok.is_empty():
        return ok.drop("_variants")
    per_length = ok.group_by("machine", "seqlen_q").agg(_VARIANT.n_unique().alias("_n"))
    chosen = per_length.filter(pl.col("_n") == pl.col("_n").max().over("machine")).select("machine", "seqlen_q")
    return (
        ok.join(chosen, on=["machine", "seqlen_q"], how="semi")
        .drop("_variants")
        .sort([*_SHAPE_FIXED, "head_dim", "dtype"], nulls_last=True)
    )


def shape_table(study: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """One line per kernel, mask, pass, length and head counts; one TFLOP/s column per (head dim,
    dtype) in head-dim order, empty where that variant has no ok cell; the sweeps that measured it."""
    if study.is_empty():
        return study, []
    d = study.with_columns(
        variant=pl.format("D={} {}", "head_dim", "dtype"),
        mask_variant=pl.col("mask_variant").fill_null(""),  # keys: never null
        mask_samples=pl.col("mask_samples").fill_null(1),
    )
    order = d.select("head_dim", "dtype", "variant").unique().sort("head_dim", "dtype").get_column("variant").to_list()
    keys = [k for k in _SHAPE_FIXED if k not in ("mask_variant", "mask_samples")] + ["mask_variant", "mask_samples"]
    wide = d.pivot(on="variant", index=keys, values="tflops", aggregate_function="max")
    sweeps = d.group_by(keys).agg(
        pl.col("sweep").drop_nulls().unique().sort().str.join(", ").alias("sweeps"),
        pl.col("batch").first().alias("batch"),
        *selection_columns(),
    )
    # the command that measures the line's cells again: its axes but head dim and dtype
    sweeps = with_selection_repro(sweeps, omit=("head_dim", "dtype")).select(*keys, "sweeps", "repro")
    out = wide.join(sweeps, on=keys, how="left")
    return out.select([*keys, *order, "sweeps", "repro"]).sort(keys), order


def best_kernel(c: pl.DataFrame) -> pl.DataFrame:
    """The fastest ok kernel per (mask, pass, length, shape, machine)."""
    keys = ["mask", "pass", "seqlen_q", "shape", "machine"]
    return mask_cells(c).sort("tflops", descending=True).group_by(keys, maintain_order=True).first().sort(keys)


def _same_run() -> pl.Expr:
    """Best and runner-up measured in one run (each cell's draws all in that run)."""
    one = pl.col("run_ids").is_not_null() & ~pl.col("run_ids").str.contains(",")
    return (one & (pl.col("run_ids") == pl.col("runner_up_run_ids"))).fill_null(False)


# the columns a cell's TFLOP/s is drawn from, and where kernel time keeps the same figure
_AT_KERNEL_TIME = {
    "tflops": "tflops_kernel",
    "tflops_ci_low": "tflops_kernel_ci_low",
    "tflops_ci_high": "tflops_kernel_ci_high",
    "tflops_draw_low": "tflops_kernel_draw_low",
    "tflops_draw_high": "tflops_kernel_draw_high",
}


def at_time(c: pl.DataFrame, at: Time) -> pl.DataFrame:
    """Cells with `tflops` (its 95% interval, its spread over draws) at kernel or eager time, and a
    `time` column saying which: at kernel time a cell whose pass was replayed from a CUDA graph takes
    the replay's figures (its `timing` says so), any other cell keeps its eager ones; `tflops_eager`
    keeps the eager TFLOP/s at either time. A re-run interval of the other time (`tflops_rerun_*`)
    is dropped: it belongs to the eager figures."""
    c = c.with_columns(time=pl.lit(str(at)), tflops_eager=pl.col("tflops"))
    if at == Time.EAGER:
        return c
    return c.drop("tflops_rerun_low", "tflops_rerun_high", strict=False).with_columns(
        pl.col(kernel).alias(eager) for eager, kernel in _AT_KERNEL_TIME.items()
    )


CHOOSE_KEYS = ("mask_label", "seqlen_q", "heads", "head_dim", "dtype", "pass", "machine")


def choose(c: pl.DataFrame, ceilings: pl.DataFrame | None = None, between_runs: float | pl.Expr = 0.0) -> pl.DataFrame:
    """Per mask (with its variant where a mask has several), length, heads, head dim, dtype, pass and
    machine: the fastest ok single-device softmax kernel, its TFLOP/s, the runner-up and the margin.

    `lead_clear`: the two kernels' 95% intervals do not overlap; where the two were measured in
    different runs, not even with the runner-up's upper end raised by `between_runs` (how far one
    cell's median moves between runs, longca.report.leases: a number, or an expression on the
    runner-up's row such as `BetweenRuns.p95_at`), because each interval holds for its own run only.

    Ranked by `tflops` as given: queries.at_time puts a time's figures there. `eager_only_faster`:
    how many of the square's kernels have no kernel time (`kernel_timed` false: they compete at their
    eager time) and yet a higher eager TFLOP/s (`tflops_eager`) than the best: at kernel time, the
    kernels that might lead once replayed (always 0 at eager time).

    The best kernel's own row fields stay (spec, sweep, cell id, commit: its repro command).
    `ceilings` (device_name, dtype, matmul_tflops, optionally matmul_tflops_per_ghz): adds
    `ceiling_tflops`, the device's measured matrix-product rate in the cell's dtype at the clock the
    best kernel ran at (its in-window SM clock times the rate per GHz, where both are known; else
    the rate as measured), and `pct_matmul`, the best TFLOP/s as a share of it. A power-capped
    matmul runs at lower clocks than short attention calls: at its own clock, FA4's 8K forward on
    an H100 stood 9% above it.
    """
    ok = pl.concat([mask_cells(c), sparse_cells(c)], how="diagonal_relaxed")
    if ok.is_empty():
        return ok
    variants = pl.col("mask_variant").n_unique().over("mask")
    ok = ok.with_columns(
        mask_label=pl.when((variants > 1) & pl.col("mask_variant").is_not_null())
        .then(pl.format("{} ({})", pl.col("mask"), pl.col("mask_variant")))
        .otherwise(pl.col("mask")),
        heads=pl.format("{}:{}", pl.col("heads_q"), pl.col("heads_kv")),
    )
    keys = list(CHOOSE_KEYS)
    ranked = ok.sort("tflops", descending=True).with_columns(
        rank=pl.col("tflops").rank("ordinal", descending=True).over(keys)
    )
    runner = ranked.filter(pl.col("rank") == 2).select(
        *keys,
        runner_up=pl.col("kernel"),
        runner_up_tflops=pl.col("tflops"),
        runner_up_tflops_ci_high=pl.col("tflops_ci_high"),
        runner_up_run_ids=pl.col("run_ids"),
        runner_up_move=between_runs if isinstance(between_runs, pl.Expr) else pl.lit(float(between_runs)),
    )
    eager = pl.col("tflops_eager") if "tflops_eager" in ranked.columns else pl.col("tflops")
    best_eager = ranked.filter(pl.col("rank") == 1).select(*keys, _best_eager=eager)
    counts = (
        ranked.join(best_eager, on=keys)
        .group_by(keys)
        .agg(
            kernels=pl.len(),  # how many ran there
            eager_only_faster=(~pl.col("kernel_timed") & (eager > pl.col("_best_eager"))).sum(),
        )
    )
    best = (
        ranked.filter(pl.col("rank") == 1)
        .join(runner, on=keys, how="left")
        .join(counts, on=keys, how="left")
        .with_columns(
            margin=pl.col("tflops") / pl.col("runner_up_tflops") - 1.0,
            # the lead is clear when the two 95% intervals of the medians do not overlap, by the
            # between-runs move more where the two come from different runs
            lead_clear=pl.col("tflops_ci_low")
            > pl.col("runner_up_tflops_ci_high")
            * pl.when(_same_run()).then(pl.lit(1.0)).otherwise(1.0 + pl.col("runner_up_move")),
        )
        .drop("rank", "runner_up_move")
    )
    if ceilings is not None and ceilings.height:
        per_ghz = "matmul_tflops_per_ghz" in ceilings.columns
        best = best.join(
            ceilings.select("device_name", "dtype", "matmul_tflops", *(["matmul_tflops_per_ghz"] if per_ghz else [])),
            on=["device_name", "dtype"],
            how="left",
        )
        at_clock = (
            pl.col("matmul_tflops_per_ghz").cast(pl.Float64) * pl.col("clock_window_mhz").cast(pl.Float64) / 1000.0
            if per_ghz and "clock_window_mhz" in best.columns
            else pl.lit(None, pl.Float64)
        )
        best = best.with_columns(ceiling_tflops=pl.coalesce(at_clock, pl.col("matmul_tflops").cast(pl.Float64)))
        best = best.with_columns(pct_matmul=pl.col("tflops") / pl.col("ceiling_tflops"))
    return best.sort(keys)


def length_label(n: int) -> str:
    """1024 -> 1K, 1048576 -> 1M, as the charts' axes print lengths."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}K"
    return str(n)


def series_table(ok: pl.DataFrame, mask: str, shapes: Sequence[str]) -> tuple[pl.DataFrame, list[str], list[str]]:
    """The numbers under a mask's throughput chart: one row per (shape, pass, kernel, machine), one
    column per length (TFLOP/s, exact mask area, median over the cell's rows), the command that
    measures the row's cells again and the commit(s) they were measured at. Returns (table,
    columns, numeric columns)."""
    df = ok.filter(pl.col("mask") == mask)
    if df.is_empty():
        return df, [], []
    lengths = sorted(df.get_column("seqlen_q").unique().to_list())
    keys = ["shape", "pass", "kernel", "machine"]
    wide = df.with_columns(length=pl.col("seqlen_q").map_elements(length_label, pl.String)).pivot(
        on="length", index=keys, values="tflops", aggregate_function="first"
    )
    fixed = df.group_by(keys).agg(
        *[pl.col(c).first() for c in ("heads_q", "heads_kv", "head_dim", "dtype", "batch", "mask", "mask_variant")],
        *selection_columns(),
        # the commit(s) the series was measured at, short (a cell's may list several)
        pl.col("git_commit")
        .str.split(", ")
        .list.explode(keep_nulls=False, empty_as_null=False)
        .str.slice(0, 8)
        .unique()
        .sort()
        .str.join(", ")
        .alias("commit"),
    )
    fixed = with_selection_repro(fixed, omit=("seqlen",))
    pass_rank = pl.col("pass").replace_strict({"fwd": 0, "bwd": 1, "fwd_bwd": 2}, default=3, return_dtype=pl.Int8)
    shape_rank = pl.col("shape").replace_strict({s: i for i, s in enumerate(shapes)}, default=len(shapes))
    table = (
        wide.join(fixed.select(*keys, "repro", "commit"), on=keys)
        .with_columns(_s=shape_rank, _p=pass_rank)
        .sort("_s", "_p", "kernel", "machine")
        .drop("_s", "_p")
    )
    cols = [length_label(n) for n in lengths]
    table = table.with_columns([pl.col(c).round(0).cast(pl.Int64) for c in cols])
    multi = table.get_column("machine").n_unique() > 1
    shown = ["shape", "pass", "kernel", *(["machine"] if multi else []), *cols, "repro", "commit"]
    return table, shown, cols


def fraction_of_full(best: pl.DataFrame, cells: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per mask: the best kernel's TFLOP/s (exact mask area) over the best full-mask TFLOP/s, same shape.

    With `cells`, a length is left out when a kernel that is the best somewhere in the same pass,
    shape and machine has no ok cell there: a partly run sweep would otherwise pit one kernel set
    against another (e.g. only cuDNN with a dense mask at a length where FA4 has not run yet).
    Kernels that never win (baselines run only at short lengths) do not decide which lengths count.
    """
    keys = ["pass", "seqlen_q", "shape", "machine"]
    if cells is not None and best.height:
        group = ["pass", "shape", "machine"]
        winners = best.select(*group, "kernel").unique()
        present = mask_cells(cells).select(*keys, "kernel").unique()
        expected = best.select(keys).unique().join(winners, on=group, how="inner")
        lacking = expected.join(present, on=[*keys, "kernel"], how="anti").select(keys).unique()
        best = best.join(lacking, on=keys, how="anti")
    full = best.filter(pl.col("mask") == "full").select(
        *keys, full_kernel=pl.col("kernel"), full_tflops=pl.col("tflops")
    )
    return (
        best.join(full, on=keys, how="inner")
        .with_columns(fraction=pl.col("tflops") / pl.col("full_tflops"))
        .sort("mask", *keys)
    )


def support_matrix(c: pl.DataFrame) -> pl.DataFrame:
    """Kernel x mask from measured single-device statuses (the paper's Table 1, measured)."""
    s = pl.col("status")
    m = (
        c.filter(pl.col("world_size") == 1)
        .group_by("kernel", "mask")
        .agg(
            n=pl.len(),
            ok=(s == "ok").sum(),
            unsupported=(s == "unsupported").sum(),
            oom=(s == "oom").sum(),
            failed=s.is_in(FAILED).sum(),
        )
    )
    category = (
        pl.when(pl.col("ok") == pl.col("n"))
        .then(pl.lit("supported"))
        .when(pl.col("failed") > 0)
        .then(pl.lit("failed (error/incorrect/timeout)"))
        .when(pl.col("unsupported") == pl.col("n"))
        .then(pl.lit("unsupported"))
        .when(pl.col("oom") == pl.col("n"))
        .then(pl.lit("OOM"))
        .when((pl.col("ok") > 0) & (pl.col("unsupported") == 0))
        .then(pl.lit("OOM at some sizes"))
        .otherwise(pl.lit("partly unsupported"))
    )
    return m.with_columns(
        category=category,
        label=pl.concat_str([pl.col("ok").cast(pl.String), pl.lit("/"), pl.col("n").cast(pl.String), pl.lit(" ok")]),
    ).sort("kernel", "mask")


def non_ok(rows: pl.DataFrame, c: pl.DataFrame) -> pl.DataFrame:
    """Every non-ok row, one line per (cell, machine, status, reason) with its row count."""
    keys = ["cell_key", "machine", "status", "reason"]
    shown = ["cell_id", "kernel", "mask", "pass", "seqlen_q", "batch", "shape", "world_size", "cp_mechanism", "run_id"]
    bad = derive(rows).filter(pl.col("status") != "ok")
    return (
        bad.group_by(keys, maintain_order=True)
        .agg(*[pl.col(k).first() for k in shown], rows=pl.len())
        .sort("status", "kernel", "mask", "pass", "seqlen_q", nulls_last=True)
    )


def reason_key(reason: str | None, mask: str | None) -> str:
    """A reason's first 60 characters with its mask's name as 'MASK' and its numbers (sizes, addresses,
    lengths) as '#': messages that differ only there (CUDA's out-of-memory text names the bytes and
    its tail varies; a refusal names the mask) fall in one group."""
    text = (reason or "").replace(mask, "MASK") if mask else (reason or "")
    return re.sub(r"0x[0-9a-fA-F]+|\d+(\.\d+)?", "#", text)[:60]


def non_ok_groups(bad: pl.DataFrame) -> pl.DataFrame:
    """non_ok's lines grouped by (status, kernel, reason up to its numbers): how many cells and rows,
    on which masks, one reason as an example, and the group's lines (`members`, for details on demand)."""
    if bad.is_empty():
        return bad
    keyed = bad.with_columns(
        _reason=pl.struct("reason", "mask").map_elements(lambda r: reason_key(r["reason"], r["mask"]), pl.String),
        # the digest names the cell (`longca repro @digest`); the id's other parts are the columns beside it
        cell_id=pl.col("cell_id").str.extract(r"(@[0-9a-f]+)$").fill_null(pl.col("cell_id")),
    )
    return (
        keyed.group_by("status", "kernel", "_reason")
        .agg(
            pl.col("reason").min().alias("reason"),  # an example; min, so that every build picks the same
            pl.col("cell_key").n_unique().alias("cells"),
            pl.col("rows").sum().alias("rows"),
            pl.col("mask").drop_nulls().unique().sort().str.join(", ").alias("masks"),
            pl.struct("mask", "pass", "seqlen_q", "shape", "world_size", "cp_mechanism", "machine", "cell_id")
            .sort_by("mask", "pass", "seqlen_q", "shape", "cell_id")
            .alias("members"),
        )
        # the reason key breaks ties, so the page is the same on every build of the same rows
        .sort("status", "kernel", "cells", "_reason", descending=[False, False, True, False])
        .drop("_reason")
    )


def partly_failed(c: pl.DataFrame) -> int:
    """Cells whose ok samples are withheld from the charts because another sample failed."""
    return c.filter(~pl.col("all_ok") & (pl.col("status") != "ok")).height


def sparse_cells(c: pl.DataFrame) -> pl.DataFrame:
    return ok_cells(c).filter(
        (pl.col("world_size") == 1) & pl.col("mask").is_in(SPARSE_MASKS) & pl.col("tflops").is_not_null()
    )


def cp_cells(c: pl.DataFrame) -> pl.DataFrame:
    return ok_cells(c).filter((pl.col("world_size") > 1) & pl.col("tflops").is_not_null())


def _cell_times(d: pl.DataFrame, **more: pl.Expr) -> pl.DataFrame:
    """One row per (spec, sweep, cell, machine): summed timed samples and the cell's wall (its rows
    share one wall clock), plus `more` aggregations."""
    return d.group_by("spec", "sweep", "cell_key", "machine").agg(
        timed_s=pl.col("samples_ms").list.sum().fill_null(0).sum() / 1000, wall_s=pl.col("cell_wall_s").max(), **more
    )


def measurement_time(rows: pl.DataFrame) -> pl.DataFrame:
    """Per (spec, sweep): summed timed kernel time (every timed sample of every row) over summed cell
    wall time (once per cell: its rows share one wall clock), over the cells that recorded a wall.
    Process start-up and scheduling between cells are outside every cell's wall, so a sweep's true
    ratio is lower than `timed_share`. `measurement_phases` splits the wall of cells that record phases."""
    per_cell = _cell_times(derive(rows).filter(pl.col("cell_wall_s").is_not_null()))
    return (
        per_cell.group_by("spec", "sweep")
        .agg(cells=pl.len(), timed_s=pl.col("timed_s").sum(), wall_s=pl.col("wall_s").sum())
        .with_columns(timed_share=pl.col("timed_s") / pl.col("wall_s"))
        .sort("spec", "sweep")
    )


PHASES = ("timed", "warmup", "other_timer", "check", "compile", "mask_build", "cooldown", "rest")


def measurement_phases(rows: pl.DataFrame) -> pl.DataFrame:
    """Per (spec, sweep): where the cells' wall time went, over the cells whose rows record phase
    times (schema_version >= 2; older rows are left out, not counted as zeros).

    Seconds and shares of the summed cell wall, disjoint so they add up to it: `timed` (timed
    samples), `compile` (compile_s), `warmup` (warm-up wall beyond the compilation inside it),
    `other_timer` (the rest of the timer call: untimed fresh forwards before timed backwards, L2
    flushes, launch gaps), `check` (correctness check, once per cell), `mask_build` (masks and
    kernel preparation), `cooldown` (idle pauses before measurements, repeat.cooldown_s) and `rest`
    (inputs, peak and clock reads, row assembly). compile_s is
    measured on the first warm-up call, so it is counted inside the warm-up up to the warm-up's
    length; any excess (compilation outside the timer, CP plans) comes out of `rest`.
    """
    n = lambda c: pl.col(c).fill_null(0.0)  # noqa: E731 - a row without a phase spent no time in it
    d = derive(rows).filter(pl.col("cell_wall_s").is_not_null() & (pl.col("schema_version").fill_null(1) >= 2))
    inside = pl.min_horizontal(n("compile_s"), n("warmup_s"))
    per_cell = _cell_times(
        d,
        check_s=n("check_s").max(),  # the cell's, repeated on each row
        timer_s=n("timer_wall_s").sum(),
        warmup_all_s=n("warmup_s").sum(),
        compile_s=n("compile_s").sum(),
        compile_in_s=inside.sum(),
        mask_build_s=n("mask_build_s").sum(),
        cooldown_s=n("cooldown_s").sum(),
    )
    per_cell = per_cell.with_columns(
        warmup_s=pl.col("warmup_all_s") - pl.col("compile_in_s"),
        other_timer_s=pl.col("timer_s") - pl.col("warmup_all_s") - pl.col("timed_s"),
        rest_s=(
            pl.col("wall_s")
            - pl.col("timer_s")
            - pl.col("check_s")
            - pl.col("mask_build_s")
            - pl.col("cooldown_s")
            - (pl.col("compile_s") - pl.col("compile_in_s"))
        ),
    )
    out = (
        per_cell.group_by("spec", "sweep")
        .agg(pl.len().alias("cells"), pl.col("wall_s").sum(), *[pl.col(f"{p}_s").sum() for p in PHASES])
        .sort("spec", "sweep")
    )
    return out.with_columns([(pl.col(f"{p}_s") / pl.col("wall_s")).alias(f"{p}_share") for p in PHASES])


# NVML's clock event (throttle) reason bits, as longca.measure.env records them (hex of the mask)
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock",
}


def throttle_names(mask: str | None) -> list[str]:
    """'0x24' -> ['sw_power_cap', 'sw_thermal']; unknown bits are kept as hex so nothing is hidden."""
    if not mask:
        return []
    bits, names = int(mask, 16), []
    for bit, name in THROTTLE_REASONS.items():
        if bits & bit:
            names.append(name)
            bits &= ~bit
    return names + ([hex(bits)] if bits else [])


def clocks(rows: pl.DataFrame) -> pl.DataFrame:
    """Per (spec, sweep): the SM clock read at each measured row's start and end, the median and
    lowest clock sampled during rows' timed windows (where recorded), and the throttle reasons
    active at its end. A sustained protocol (many back-to-back calls) runs under the power
    cap at lower clocks than short bursts do, so timings from different protocols differ by this much."""
    cols = {"clock_start_mhz", "clock_end_mhz", "throttle_reasons"}
    if not cols <= set(rows.columns):
        return pl.DataFrame()
    d = rows.filter(pl.col("clock_end_mhz").is_not_null() & (pl.col("status") == "ok"))
    if d.height == 0:
        return pl.DataFrame()
    d = d.with_columns(_names=pl.col("throttle_reasons").map_elements(throttle_names, return_dtype=pl.List(pl.String)))
    return (
        d.group_by("spec", "sweep")
        .agg(
            rows=pl.len(),
            start_mhz=pl.col("clock_start_mhz").median(),
            end_mhz=pl.col("clock_end_mhz").median(),
            end_p10_mhz=pl.col("clock_end_mhz").quantile(0.1, "nearest"),
            # sampled while the calls ran (rows of schema 5 on): what the kernels actually saw
            window_mhz=pl.col("clock_window_mhz").median() if "clock_window_mhz" in d.columns else pl.lit(None),
            window_min_mhz=pl.col("clock_window_min_mhz").min()
            if "clock_window_min_mhz" in d.columns
            else pl.lit(None),
            power_capped=pl.col("_names").list.contains("sw_power_cap").mean(),
            reasons=pl.col("_names").explode().drop_nulls().unique().sort().str.join(", "),
        )
        .with_columns(pl.col("start_mhz", "end_mhz").round(0).cast(pl.Int32))
        .sort("spec", "sweep")
    )


INTERVAL_GOAL = 0.02  # a drawn time's 95% interval within +-2% of its median (docs/measurement.md)


def intervals(rows: pl.DataFrame) -> pl.DataFrame:
    """Per (spec, sweep, target): how tight the ok rows' timing intervals are, on the time the
    charts draw (the graph replay's where there is one, else the eager call's). `target` is the
    adaptive protocol's +-ci_target ("none" for rows measured before it). `full_range`: rows of
    fewer than 6 samples (calls over 1 s stop at 3; a graph replay's count is not stored, so a replay
    of 1 s or more counts here), whose interval is their whole range and covers the median with
    less than 95% probability (75% at 3 samples); `within`: rows whose interval lies within
    +-INTERVAL_GOAL of the median (a single sample has none), over all rows (`share`) and over those
    with a 95% interval (`share_95`); `met`: rows that reached their own target (`ci_met`)."""
    need = {"status", "median_ms", "samples_ms"}
    if not need <= set(rows.columns):
        return pl.DataFrame()
    d = _with_sample_ci(rows.filter(pl.col("status") == "ok"))
    for name in ("graph_median_ms", "graph_ci_low_ms", "graph_ci_high_ms", "ci_target", "ci_met"):
        if name not in d.columns:
            d = d.with_columns(pl.lit(None, pl.Float64 if name != "ci_met" else pl.Boolean).alias(name))
    graph = pl.col("graph_median_ms").is_not_null()
    med = pl.when(graph).then(pl.col("graph_median_ms")).otherwise(pl.col("median_ms"))
    low = pl.when(graph).then(pl.col("graph_ci_low_ms")).otherwise(pl.col("ci_low_ms"))
    high = pl.when(graph).then(pl.col("graph_ci_high_ms")).otherwise(pl.col("ci_high_ms"))
    n = pl.col("samples_ms").list.len()
    d = d.filter(low.is_not_null() & high.is_not_null()).with_columns(
        # a single sample is no interval: never "within"
        _half=pl.when(graph | (n > 1)).then(pl.max_horizontal(med - low, high - med) / med),
        _full=pl.when(graph).then(pl.col("graph_median_ms") >= LONG_CALL_MS).otherwise(n < min_samples()),
        target=pl.when(pl.col("ci_target").is_null())
        .then(pl.lit("none"))
        .otherwise(pl.format("+-{}%", (pl.col("ci_target") * 100).round(2))),
    )
    if d.height == 0:
        return pl.DataFrame()
    within = (pl.col("_half") <= INTERVAL_GOAL).fill_null(False)
    return (
        d.group_by("spec", "sweep", "target")
        .agg(
            rows=pl.len(),
            full_range=pl.col("_full").sum(),
            within=within.sum(),
            share=within.mean(),
            share_95=within.filter(~pl.col("_full")).mean(),
            met=pl.col("ci_met").sum(),
        )
        .with_columns(pl.col("share", "share_95").round(3))
        .sort("spec", "sweep", "target")
    )


def agreement(rows: pl.DataFrame) -> pl.DataFrame:
    """Per (spec, sweep, kernel, pass, comparator): the full-length agreement of the drawn rows that
    asked for one (cells longer than their check: longca.run.agreement). `lengths`: the shortest and
    longest compared; `max_out`, `max_grad`: the largest relative difference of the output and of
    dQ, dK, dV (cells with a backward, schema 7 on); `incorrect`: rows it made incorrect;
    `comparator` "none": rows no listed kernel served, with the first such reason."""
    grads = ["agree_rel_diff_dq", "agree_rel_diff_dk", "agree_rel_diff_dv"]
    if not {"agree_kernel", "agree_rel_diff", "agree_reason"} <= set(rows.columns):
        return pl.DataFrame()
    d = rows.filter(pl.col("agree_kernel").is_not_null() | pl.col("agree_reason").is_not_null())
    if d.height == 0:
        return pl.DataFrame()
    for name in grads:
        if name not in d.columns:
            d = d.with_columns(pl.lit(None, pl.Float64).alias(name))
    return (
        d.with_columns(
            comparator=pl.col("agree_kernel").fill_null("none"),
            _grad=pl.max_horizontal(grads),
        )
        .group_by("spec", "sweep", "kernel", "pass", "comparator")
        .agg(
            rows=pl.len(),
            _lo=pl.col("seqlen_q").min(),
            _hi=pl.col("seqlen_q").max(),
            max_out=pl.col("agree_rel_diff").max(),
            max_grad=pl.col("_grad").max(),
            grads_compared=pl.col("_grad").is_not_null().sum(),
            incorrect=(pl.col("status") == "incorrect").sum(),
            reason=pl.col("agree_reason").drop_nulls().first(),
        )
        .with_columns(pl.col("_lo", "_hi").map_elements(length_label, return_dtype=pl.String))
        .with_columns(
            lengths=pl.when(pl.col("_lo") == pl.col("_hi"))
            .then(pl.col("_lo"))
            .otherwise(pl.format("{}-{}", "_lo", "_hi"))
        )
        .drop("_lo", "_hi")
        .sort("spec", "sweep", "kernel", "pass", "comparator")
    )


def cp_vs_single(c: pl.DataFrame) -> pl.DataFrame:
    """Each ok CP cell against the same kernel on one GPU of the same model with the same per-rank
    work: global length / world size tokens, same mask and mask variant, heads, head dim, dtype and
    pass (the single cell's median over machines and sweeps). `ratio` = CP per-GPU TFLOP/s /
    single-GPU TFLOP/s, what a scaling goal like "95% of the single-GPU kernel" reads. A kernel
    whose rows name a tunable configuration in `backend` (the Triton kernel's tiles) is compared
    only at the same configuration, so a CP row that does not name its tiles has no match; CP cells
    without a match are left out."""

    def config(df: pl.DataFrame) -> pl.DataFrame:
        b = pl.col("backend").fill_null("")
        return df.with_columns(
            config=pl.when(b.str.starts_with("triton tiles"))
            .then(b)
            .when(pl.col("kernel") == "triton_block_sparse")
            .then(pl.lit("unnamed tiles"))
            .otherwise(pl.lit(""))
        )

    keys = [
        "kernel",
        "mask",
        "mask_variant",
        "pass",
        "heads_q",
        "heads_kv",
        "head_dim",
        "dtype",
        "device_name",
        "config",
    ]
    cp = config(cp_cells(c)).with_columns(tokens_per_gpu=pl.col("seqlen_q") // pl.col("world_size"))
    single = (
        config(ok_cells(c).filter((pl.col("world_size") == 1) & pl.col("tflops").is_not_null()))
        .group_by(*keys, tokens_per_gpu=pl.col("seqlen_q"))
        .agg(single_tflops=pl.col("tflops").median())
    )
    return (
        cp.join(single, on=[*keys, "tokens_per_gpu"], how="inner", nulls_equal=True)
        .with_columns(ratio=pl.col("tflops") / pl.col("single_tflops"))
        .sort("mask", "heads_kv", "tokens_per_gpu", "pass", "world_size", "cp_mechanism", "cp_balance")
    )


DENSE_REFERENCE_KERNEL = "sdpa_cudnn"


def sparse_vs_dense(c: pl.DataFrame, dense_kernel: str = DENSE_REFERENCE_KERNEL) -> pl.DataFrame:
    """Each ok single-GPU block-sparse cell against `dense_kernel` on the full mask at the same
    length, heads, head dim, dtype, pass and GPU model (its median over sweeps and machines).

    `ratio` = sparse TFLOP/s (exact kept area) / dense TFLOP/s: how much of the dense kernel's rate
    the sparse kernel keeps (the block-sparse goal reads it at block 128, density 0.5, 64K). `speedup` =
    dense time / sparse time: what skipping blocks buys (at most 1 / density for a kernel that
    keeps the dense rate). Sparse cells without a dense match are left out."""
    keys = ["seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "dtype", "pass", "device_name"]
    dense = (
        ok_cells(c)
        .filter(
            (pl.col("world_size") == 1)
            & (pl.col("kernel") == dense_kernel)
            & (pl.col("mask") == "full")
            & pl.col("tflops").is_not_null()
        )
        .group_by(keys)
        .agg(dense_tflops=pl.col("tflops").median(), dense_ms=pl.col("median_ms").median())
    )
    return (
        sparse_cells(c)
        .join(dense, on=keys, how="inner", nulls_equal=True)
        .with_columns(ratio=pl.col("tflops") / pl.col("dense_tflops"), speedup=pl.col("dense_ms") / pl.col("median_ms"))
        .sort("kernel", "mask", "block_size", "density", "heads_kv", "seqlen_q", "pass", nulls_last=True)
    )


def sparse_side_by_side(c: pl.DataFrame) -> tuple[pl.DataFrame, list[str]]:
    """The single-GPU block-sparse cells kernel by kernel: one line per (mask draw, length, heads,
    head dim, dtype, pass, machine), one column per kernel holding its TFLOP/s (exact kept area)
    where its cell is ok, or its status ('unsupported', 'oom', ...) where not, and `best`, the
    fastest ok kernel. Returns the table and its kernel columns. The reasons are on the Status page."""
    keys = ["mask", "mask_variant", "seqlen_q", "heads_q", "heads_kv", "head_dim", "dtype", "pass", "machine"]
    d = c.filter((pl.col("world_size") == 1) & pl.col("mask").is_in(SPARSE_MASKS))
    if d.is_empty():
        return d.clear(), []
    ok = pl.col("all_ok") & pl.col("tflops").is_not_null()
    shown = d.with_columns(
        value=pl.when(ok).then(pl.col("tflops").round(1).cast(pl.String)).otherwise(pl.col("status"))
    )
    kernels = sorted(shown.get_column("kernel").unique().to_list())
    wide = shown.pivot(on="kernel", index=keys, values="value", aggregate_function="first")
    layout = with_selection_repro(
        d.group_by(keys).agg(
            pl.col("block_size").first(), pl.col("density").median(), pl.col("batch").first(), *selection_columns()
        ),
        omit=("kernel",),  # the command that measures the line's cells again, every kernel of it
    ).drop("batch", "spec")
    best = (
        d.filter(ok)
        .sort("tflops", descending=True)
        .group_by(keys, maintain_order=True)
        .agg(best=pl.col("kernel").first())
    )
    table = (
        wide.join(layout, on=keys, how="left", nulls_equal=True)
        .join(best, on=keys, how="left", nulls_equal=True)
        .sort("mask", "block_size", "mask_variant", "heads_kv", "seqlen_q", "pass", nulls_last=True)
    )
    return table.select(*keys, "block_size", "density", *kernels, "best", "repro"), kernels


def linear_vs_softmax(c: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Tokens/s of each linear kernel and of the best softmax kernel on the same mask, pass and shape.

    Returns (series, crossovers). The crossover is the first measured length from which the linear
    kernel stays ahead at every longer measured length; `below` is the length before it.
    The best softmax kernel is taken only at lengths where every softmax kernel that runs that mask
    and shape has a row (ok, oom, error...; `unsupported` ones do not count): in a partly run sweep, a
    length where only a slow kernel has run would otherwise show a collapse of "best softmax" that no
    measurement supports.
    """
    keys = ["mask", "pass", "dtype", "heads_q", "heads_kv", "head_dim", "machine"]
    ok = ok_cells(c).filter((pl.col("world_size") == 1) & pl.col("tokens_per_s").is_not_null())
    lin = ok.filter(pl.col("kernel_family") == "linear")
    tried = (
        _dense_softmax(c)
        .filter(pl.col("status") != "unsupported")  # unsupported never runs anywhere
        .group_by(*keys, "seqlen_q")
        .agg(kernels=pl.col("kernel").n_unique())
    )
    complete = tried.filter(pl.col("kernels") == pl.col("kernels").max().over(keys))
    soft = (
        _dense_softmax(ok)
        .join(complete.select(*keys, "seqlen_q"), on=[*keys, "seqlen_q"], how="semi")
        .sort("tokens_per_s", descending=True)
        .group_by(*keys, "seqlen_q", maintain_order=True)
        .first()
    )
    heads = pl.concat_str([pl.col("heads_q").cast(pl.String), pl.lit(":"), pl.col("heads_kv").cast(pl.String)])
    group = pl.concat_str(
        [
            pl.col("mask"),
            pl.lit(" "),
            pl.col("pass"),
            pl.lit(" H="),
            heads,
            pl.lit(" D="),
            pl.col("head_dim").cast(pl.String),
            pl.lit(" "),
            pl.col("dtype"),
            pl.lit(" on "),
            pl.col("machine"),
        ]
    )
    soft = soft.join(lin.select(keys).unique(), on=keys, how="semi")
    cols = [*keys, "seqlen_q", "tokens_per_s", "kernel", "kernel_family", "batch", "median_ms", "run_ids"]
    cols += ["mask_variant", "spec", "sweep"]
    series = (
        pl.concat(
            [
                lin.select(cols).with_columns(series=pl.col("kernel")),
                soft.select(cols).with_columns(series=pl.concat_str([pl.lit("best softmax")])),
            ]
        )
        .with_columns(group=group)
        .sort("group", "series", "seqlen_q")
    )

    pairs = (
        lin.select(*keys, "seqlen_q", "kernel", lin_tps=pl.col("tokens_per_s"))
        .join(
            soft.select(*keys, "seqlen_q", soft_tps=pl.col("tokens_per_s"), soft_kernel=pl.col("kernel")),
            on=[*keys, "seqlen_q"],
            how="inner",
        )
        .with_columns(group=group, ahead=pl.col("lin_tps") >= pl.col("soft_tps"))
        .sort("group", "kernel", "seqlen_q")
    )
    rows = []
    for (grp, kernel), p in pairs.group_by("group", "kernel", maintain_order=True):
        lengths, ahead = p.get_column("seqlen_q").to_list(), p.get_column("ahead").to_list()
        i = len(ahead)
        while i > 0 and ahead[i - 1]:
            i -= 1
        rows.append(
            {
                "group": grp,
                "kernel": kernel,
                "crossover": lengths[i] if i < len(lengths) else None,
                "below": lengths[i - 1] if 0 < i <= len(lengths) else None,
                "lengths": len(lengths),
            }
        )
    schema = {"group": pl.String, "kernel": pl.String, "crossover": pl.Int64, "below": pl.Int64, "lengths": pl.Int64}
    # the command that measures a group's cells again: every kernel it compares (the linear ones and
    # the softmax ones) at every length, from each sweep its rows come from
    fixed = ("mask", "mask_variant", "heads_q", "heads_kv", "head_dim", "dtype", "pass", "batch")
    repro = with_selection_repro(
        series.group_by("group").agg(*[pl.col(k).first() for k in fixed], *selection_columns()),
        omit=("kernel", "seqlen"),
    ).select("group", "repro")
    cross = pl.DataFrame(rows, schema=schema).join(repro, on="group", how="left")
    return series.drop("mask_variant", "spec", "sweep"), cross


ENV_FACTS = (
    "device_name",
    "device_count",
    "compute_capability",
    "driver",
    "cuda",
    "torch",
    "cudnn",
    "triton",
    "packages",
    "host",
    "host_cpu",
    "git_commit",
    "longca_version",
)


def environments(rows: pl.DataFrame) -> pl.DataFrame:
    """The chosen environment facts, one line per env_id, with the runs and rows it produced."""
    return (
        rows.with_columns(pl.col("env_id").fill_null("unknown"))
        .group_by("env_id", maintain_order=True)
        .agg(
            *[pl.col(f).drop_nulls().first() for f in ENV_FACTS],
            rows=pl.len(),
            run_ids=pl.col("run_id").drop_nulls().unique().sort().str.join(", "),
            first=pl.col("timestamp").min(),
            last=pl.col("timestamp").max(),
        )
        .sort("env_id")
    )


def machines(frame: pl.DataFrame) -> list[str]:
    """The distinct machines (device @ host) a set of cells came from, for captions."""
    if frame.is_empty() or "machine" not in frame.columns:
        return []
    return sorted(frame.get_column("machine").drop_nulls().unique().to_list())

"""Build a report directory from result Parquet files: queries -> charts -> exports -> pages.

Layout of `out`: index.html and the other pages, assets/ (Vega bundle, script, CSS), charts/
(SVG, PNG, Vega-Lite JSON and CSV per chart), data/ (the rows as Parquet and CSV), gallery/.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa

import longca
from longca.report import (
    assets,
    ceilings,
    charts,
    cp_local,
    cp_model,
    export,
    fidelity,
    gallery,
    leases,
    load,
    pages,
    peers,
    queries,
)
from longca.report.charts import ChartSpec
from longca.report.pages import Page, Table
from longca.report.repro import with_repro
from longca.store.write import PUBLISHED_ZSTD_LEVEL, write_table
from longca.vocab import Time


@dataclass
class Built:
    out: Path
    pages: list[Path]
    charts: list[str]
    timings: dict[str, float] = field(default_factory=dict)


def shown_path(p: str | Path) -> str:
    """A path fit for a public page: relative when under the working directory, else its name only."""
    p = Path(p)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.name


def _table(df: pl.DataFrame, cols: Sequence[str], numeric: Sequence[str] = ()) -> Table:
    cols = [c for c in cols if c in df.columns]
    rows = [list(r) for r in df.select(cols).iter_rows()]
    rows = [[round(v, 4) if isinstance(v, float) else v for v in r] for r in rows]
    return Table(columns=list(cols), rows=rows, numeric=set(numeric))


def _support_table(matrix: pl.DataFrame) -> Table:
    masks = sorted(matrix.get_column("mask").unique().to_list())
    kernels = sorted(matrix.get_column("kernel").unique().to_list())
    by = {(r["kernel"], r["mask"]): r for r in matrix.iter_rows(named=True)}
    symbol = {"supported": "✓", "unsupported": "✗", "OOM": "OOM"}
    rows, classes = [], []
    for k in kernels:
        row, cls = [k], [""]
        for m in masks:
            r = by.get((k, m))
            if r is None:
                row.append("not run")
                cls.append("")
                continue
            detail = ", ".join(f"{r[s]} {s}" for s in ("ok", "oom", "unsupported", "failed") if r[s])
            row.append(f"{symbol.get(r['category'], r['category'])} ({detail})")
            cls.append("st-" + r["category"].split(" (")[0].replace(" ", "-"))
        rows.append(row)
        classes.append(cls)
    return Table(columns=["kernel", *masks], rows=rows, cell_class=classes)


def _fraction_summary(frac: pl.DataFrame) -> tuple[pl.DataFrame, list[str], list[str]]:
    """One line per (mask, pass, shape, machine): min, median and max fraction over lengths, the number
    of lengths, and the best kernels with the number of lengths each won ("fa4 10, flex 1")."""
    keys = ["mask", "pass", "shape", "machine"]
    wins = (
        frac.group_by(*keys, "kernel")
        .agg(n=pl.len())
        .sort([*keys, "n", "kernel"], descending=[False] * len(keys) + [True, False])
        .group_by(keys, maintain_order=True)
        .agg(
            pl.concat_str([pl.col("kernel"), pl.col("n").cast(pl.String)], separator=" ")
            .str.join(", ")
            .alias("best kernel (lengths won)")
        )
    )
    summary = (
        frac.group_by(keys)
        .agg(
            pl.col("fraction").min().alias("min fraction"),
            pl.col("fraction").median().alias("median fraction"),
            pl.col("fraction").max().alias("max fraction"),
            pl.col("seqlen_q").n_unique().alias("lengths"),
        )
        .join(wins, on=keys, how="left")
        .sort(keys)
    )
    numeric = ["min fraction", "median fraction", "max fraction", "lengths"]
    return summary, summary.columns, numeric


def _overview(
    c: pl.DataFrame, rows: pl.DataFrame, spec_name: str, stale: pl.DataFrame | None = None
) -> tuple[Page, list[ChartSpec]]:
    page = Page("overview.html", "Overview", f"Overview: {spec_name}")
    best = queries.best_kernel(c)
    frac = queries.fraction_of_full(best, c)
    matrix = queries.support_matrix(c)
    status_counts = rows.group_by("status").len().sort("status")
    page.p(
        f"{rows.height} result rows, {c.height} cells; statuses: "
        + ", ".join(f"{s} {n}" for s, n in status_counts.iter_rows())
        + ". Only ok cells are drawn; every other "
        "cell is listed with its reason on the Status page."
    )
    if stale is not None and stale.height:
        page.p(
            ", ".join(f"{n} cells of sweep {sw}" for sw, n in stale.select("sweep", "cells").iter_rows())
            + f" come from an earlier version of {stale.get_column('spec_file')[0]}, measured before it changed "
            "how they are measured; they are drawn until measured again (Status page).",
            "note",
        )
    page.h2("Kernel × mask support (measured)")
    page.chart(charts.support_chart(matrix), "No single-device cells.")
    if matrix.height:
        page.table(_support_table(matrix))
    page.p(
        "The fastest kernel per mask, length and shape, with the runner-up and the margin, is on the Choose page.",
        "note",
    )
    page.h2("Mask efficiency")
    page.chart(charts.fraction_chart(frac), "No mask has ok cells at lengths where the full mask also has them.")
    if frac.height:
        page.p(
            "Per mask, pass and shape: the spread of that fraction over lengths, and which kernel was the "
            "best at how many of them (the kernel that loses least on that mask)."
        )
        page.table(_table(*_fraction_summary(frac)))
    return page, page.charts()


def _choose_page(
    c: pl.DataFrame,
    ceiling: pl.DataFrame | None,
    kernels: list[str],
    moves: leases.BetweenRuns | None,
    replayed: leases.BetweenRuns | None = None,
    current: tuple[str, set[str]] | None = None,
) -> Page:
    """The first page: the fastest kernel per mask and length for a shape, ranked at kernel time and
    at eager time (a button switches), each lead judged by the moves between runs of its time.
    `current`: (spec name, the ids of its current cells): the answers come only from cells measured
    under the spec's current protocol (its cells' digests); that spec's other cells are left out
    and counted (the Status page lists them)."""
    page = Page("index.html", "Choose", "Which kernel for my shape?")
    protocol_note = None
    if current is not None:
        name, ids = current
        theirs = pl.col("spec") == name
        earlier = c.filter(theirs & ~pl.col("cell_id").is_in(list(ids))).height
        c = c.filter(~theirs | pl.col("cell_id").is_in(list(ids)))
        protocol_note = (
            f"The answers come only from cells measured under the current protocol of spec {name!r} "
            f"({c.filter(theirs).height} cells)"
            + (
                f"; {earlier} of its cells measured under earlier protocols are left out here (the Status page "
                "lists them, the downloads hold them)."
                if earlier
                else "."
            )
        )
    ranked = []
    # kernel time only where some cell was replayed (never on a CPU, which has no CUDA graphs)
    for at in Time if queries.first_time(c) == Time.KERNEL else [Time.EAGER]:
        cells = queries.at_time(c, at)
        move = leases.move_at(at, moves, replayed)
        if moves is not None:  # the tooltips' re-run interval, of the time ranked
            low, high = leases.rerun_interval(move, pl.col("tflops"), pl.col("tflops_ci_low"), pl.col("tflops_ci_high"))
            cells = cells.with_columns(low.alias("tflops_rerun_low"), high.alias("tflops_rerun_high"))
        ranked.append(queries.choose(cells, ceiling, move))
    best = pl.concat(ranked, how="diagonal_relaxed")
    page.p(
        "Pick the attention shape you train with; every mask and length then shows the fastest kernel "
        "measured there. Further pages: every kernel per mask (Masks), block-sparse (Sparse), context "
        "parallelism (CP), what did not run and why (Status), and how the numbers were taken (Data)."
    )
    page.chart(charts.choose_chart(best, kernels), "No ok single-device softmax cells to choose from.")
    if protocol_note:
        page.p(protocol_note, "note")
    if moves is None:
        page.p(
            "A margin marked ~ lies inside the two kernels' 95% intervals. Each interval holds for its own run; "
            "how far a median moves between runs was not measured for these rows (`longca report --reruns`).",
            "note",
        )
    else:
        replay_note = (
            f" At kernel time a replayed runner-up's interval is widened by the moves of replayed pairs instead: "
            f"{replayed.sentence()}."
            if replayed is not None
            else " No cell was replayed in two runs, so at kernel time too the eager moves apply."
        )
        page.p(
            f"A margin marked ~ lies inside the two kernels' 95% intervals, widened, where the two ran in "
            f"different runs, by the move measured between runs of the same cells at the runner-up's time "
            f"scale: {moves.sentence()}.{replay_note} "
            f"Every tooltip gives a cell's 95% interval of its own run (tflops_ci_low, tflops_ci_high) and its "
            f"re-run interval (tflops_rerun_low, tflops_rerun_high): the first widened to its time scale's move, "
            f"where a re-run on another machine lease should land.",
            "note",
        )
    if ceiling is None or not ceiling.height:
        page.p(
            "No measured matrix-product rate was given (`longca report --ceiling`), so the squares do not say "
            "how close the best kernel comes to the device's ceiling.",
            "note",
        )
    else:
        page.p(
            "Measured matrix-product rates (N x N x N, longca's CUDA timer): "
            + "; ".join(
                f"{d} {t}: {v:.0f} TFLOP/s"
                for d, t, v in ceiling.select("device_name", "dtype", "matmul_tflops").iter_rows()
            )
            + ". Where the rate was measured with its in-window clock, each square's share is of the rate "
            "at the clock its best kernel ran at (the rate per GHz times that clock).",
            "note",
        )
    return page


def _mask_pages(c: pl.DataFrame, peer: pl.DataFrame, kernels: Sequence[str] = ()) -> list[Page]:
    ok, studied = queries.for_length_charts(queries.mask_cells(c))
    gpu = ok.filter(pl.col("device") == "cuda")
    at = queries.first_time(ok)
    at_note = (
        ", at kernel time as the chart first draws them (replayed where the cell's pass was captured, eager "
        "elsewhere; the chart's buttons and tooltips give eager time)"
        if at == Time.KERNEL
        else ""
    )
    at_first = queries.at_time(ok, at)  # the figures the chart draws first: kernel time, where any cell has one
    out = []
    for mask in queries.masks_with_rows(c):
        page = Page(f"mask-{charts.slug(mask)}.html", mask, f"Mask {mask}")
        on_gpu = gpu.filter(pl.col("mask") == mask).height > 0
        shown = peer.filter(pl.col("mask") == mask) if on_gpu else peer.clear()
        page.chart(
            charts.mask_metric(mask, ok, "tflops", shown, kernels), f"No ok cells on mask {mask}: see the Status page."
        )
        shapes = charts.shape_order(ok.filter(pl.col("mask") == mask))
        numbers, cols, lengths = queries.series_table(at_first, mask, shapes)
        if numbers.height:
            page.p(
                f"The numbers drawn above{at_note}: TFLOP/s (exact mask area) per shape, pass and kernel at each "
                "length, and the command that measures that row's cells again (every length; add --only seqlen=... "
                "for one)."
            )
            page.table(_table(numbers, cols, numeric=lengths))
        if not on_gpu and peer.filter(pl.col("mask") == mask).height:
            page.p(
                "Published figures for this mask are GPU figures; they are not drawn over rows measured "
                "without a GPU (see Peers).",
                "note",
            )
        page.chart(
            charts.mask_metric(mask, ok, "peak_mem_gib", peer.clear(), kernels), "No memory figures on this mask."
        )
        n_study = studied.filter(pl.col("mask") == mask).height
        if n_study:
            page.p(
                f"{n_study} ok cells on this mask at another head dim or dtype, measured at one length, are "
                "drawn on the Shapes page (head dim and dtype) beside the same kernels' other shapes.",
                "note",
            )
        n_bad = c.filter((pl.col("mask") == mask) & ~pl.col("all_ok") & (pl.col("world_size") == 1)).height
        if n_bad:
            page.p(f"{n_bad} cells on this mask are not ok and are not drawn: see the Status page.", "note")
        out.append(page)
    return out


def _family_pages(c: pl.DataFrame, peer: pl.DataFrame, local: pl.DataFrame | None = None) -> list[Page]:
    sparse, cp = queries.sparse_cells(c), queries.cp_cells(c)
    p_sparse = Page("sparse.html", "Sparse", "Block-sparse attention")
    on_gpu = sparse.filter(pl.col("device") == "cuda").height > 0
    sp = peers.for_sparse(peer) if on_gpu else peer.clear()
    p_sparse.chart(charts.sparse_chart(sparse, sp, "density"), "No ok block-sparse cells.")
    p_sparse.chart(charts.sparse_chart(sparse, sp, "block_size"), "No ok block-sparse cells.")
    p_sparse.chart(charts.sparse_chart(sparse, sp, "seqlen_q"), "No ok block-sparse cells.")
    vs = queries.sparse_vs_dense(c)
    if vs.height:
        p_sparse.p(
            f"Each block-sparse cell against dense {queries.DENSE_REFERENCE_KERNEL} on the full mask at the "
            "same length, heads, head dim, dtype and pass on the same GPU model (measured in another cell, "
            "usually another process). ratio = sparse TFLOP/s (exact kept area) / dense TFLOP/s: the share "
            "of the dense rate kept; speedup = dense time / sparse time, at most 1 / density for a kernel "
            "that keeps the dense rate."
        )
        p_sparse.table(
            _table(
                vs.with_columns(heads=pl.format("{}:{}", "heads_q", "heads_kv"), density=pl.col("density").round(3)),
                [
                    "kernel",
                    "mask",
                    "block_size",
                    "density",
                    "heads",
                    "seqlen_q",
                    "pass",
                    "tflops",
                    "dense_tflops",
                    "ratio",
                    "speedup",
                    "backend",
                    "device_name",
                ],
                numeric=["block_size", "density", "seqlen_q", "tflops", "dense_tflops", "ratio", "speedup"],
            )
        )
    side, kernels = queries.sparse_side_by_side(c)
    if side.height:
        p_sparse.p(
            "Every block-sparse cell kernel by kernel: the same mask draw, length, heads and pass on one "
            "line, each kernel's TFLOP/s (exact kept area) where its cell is ok, otherwise its status "
            "(the reason is on the Status page); best = the fastest ok kernel; repro = the command that "
            "measures the line's cells again."
        )
        p_sparse.table(
            _table(
                side.with_columns(heads=pl.format("{}:{}", "heads_q", "heads_kv"), density=pl.col("density").round(3)),
                [
                    "mask",
                    "block_size",
                    "density",
                    "heads",
                    "head_dim",
                    "dtype",
                    "seqlen_q",
                    "pass",
                    *kernels,
                    "best",
                    "machine",
                    "repro",
                ],
                numeric=["block_size", "density", "seqlen_q", *kernels],
            )
        )
    p_cp = Page("cp.html", "CP", "Context parallelism")
    cpp = peers.for_cp(peer) if cp.filter(pl.col("device") == "cuda").height else peer.clear()
    for kind, missing in (
        ("world", "No ok multi-GPU cells."),
        ("length", "No ok multi-GPU cells."),
        ("comm", "No cell recorded exposed communication."),
        ("imbalance", "No cell recorded per-rank times or areas."),
    ):
        p_cp.chart(charts.cp_chart(cp, cpp, kind), missing)
    vs = queries.cp_vs_single(c)
    if vs.height:
        p_cp.p(
            "Per-GPU throughput against the same kernel on one GPU with the same per-rank work "
            "(global length / world size tokens, same mask, heads and pass): ratio 1 is perfect scaling. "
            "For full and causal the single-GPU problem is exactly one rank's share; for the other masks "
            "the single-GPU cell is that mask at the shorter length (its own documents or prefix), the "
            "same kind of work rather than the same pairs, so a ratio above 1 can occur."
        )
        p_cp.table(
            _table(
                with_repro(vs).with_columns(heads=pl.format("{}:{}", "heads_q", "heads_kv")),
                [
                    "mask",
                    "heads",
                    "pass",
                    "tokens_per_gpu",
                    "world_size",
                    "cp_mechanism",
                    "cp_balance",
                    "kernel",
                    "tflops",
                    "single_tflops",
                    "ratio",
                    "device_name",
                    "repro",
                ],
                numeric=["tokens_per_gpu", "world_size", "tflops", "single_tflops", "ratio"],
            )
        )
    if local is not None and local.height:
        p_cp.h2("One rank's local work on one GPU")
        p_cp.p(
            "Each rank of a CP run played in turn on one GPU (benchmarks/cp_rank_local.py): every participant's "
            "K/V held in memory, nothing sent, so the time is only the rank's own attention calls and the "
            "combination of their results (backward: each ring step's backward on the combined output and LSE, "
            "and the float32 accumulation of the gradients). Every configuration was checked against the float32 "
            "reference first (largest relative error shown). Per-GPU TFLOP/s by the CP convention, global FLOPs "
            "over the slower rank's time x world size; the single-GPU kernel ran on one rank's token count in the "
            "same process. The gap between these figures and the multi-GPU cells above is what communication "
            "and its overlap cost. The autograd column (some backward runs): the same steps with the step's "
            "forward run again under autograd, as the Flex backward did before it called Flex's own backward "
            "operator. For document masks a rank's 32K tokens are not the single-GPU problem at 32K (documents "
            "are drawn per length), so their ratio can pass 1. A configuration run more than once (after a code "
            "change, for example) appears once per file; the file names the run."
        )
        p_cp.table(_table(local, cp_local.shown_columns(local), numeric=cp_local.NUMERIC))
    p_lin = Page("linear.html", "Linear", "Linear attention against softmax")
    series, cross = queries.linear_vs_softmax(c)
    p_lin.chart(charts.linear_chart(series, cross), "No ok linear-attention cells.")
    if cross.height:
        shown = cross.with_columns(
            verdict=pl.when(pl.col("crossover").is_null())
            .then(pl.lit("softmax ahead at the longest length"))
            .when(pl.col("below").is_null())
            .then(pl.lit("linear ahead at every shared length"))
            .otherwise(pl.format("between {} and {} tokens", pl.col("below"), pl.col("crossover")))
        )
        p_lin.table(
            _table(
                shown,
                ["group", "kernel", "verdict", "below", "crossover", "lengths", "repro"],
                numeric=["below", "crossover", "lengths"],
            )
        )
    return [p_sparse, p_cp, p_lin, _shapes_page(c)]


def _cp_model_page(model: pl.DataFrame, validation: pl.DataFrame | None, c: pl.DataFrame) -> Page:
    page = Page("cp-model.html", "CP at scale", "CP at scale (modelled)")
    if model.is_empty() and validation is None:
        return page
    lines = cp_model.best_variants(model)
    page.p(
        "Modelled, not measured: each rank's schedule is traced from the mechanism's own code, its "
        "attention calls timed at the kernel's measured single-GPU rates, its exchanges and collectives "
        "at the cluster's link figures, all ranks simulated together (docs/cp-model.md). Measured CP "
        "cells of the same mask and pass are drawn as black diamonds.",
        "note",
    )
    page.chart(charts.cp_model_chart(lines, cp_model.measured_points(queries.cp_cells(c), lines)), "No ok model rows.")
    if not model.is_empty():
        page.h2("Assumptions")
        for text in model.get_column("assumptions").drop_nulls().unique().sort().to_list():
            page.p(text)
        page.p(
            "Not modelled: the LSE combination and other local work between attention calls, kernel launch "
            "gaps, contention between collectives of one node, and NCCL protocol effects beyond a "
            "per-message latency. A sampled mask's row is its median modelled draw (`draws`, `tflops_draws`)."
        )
        unsupported = model.filter(pl.col("status") != "ok")
        if unsupported.height:
            page.h2("Cells the model or the mechanisms refuse")
            page.table(
                _table(
                    unsupported.group_by("cluster", "cp_mechanism", "world_size", "reason")
                    .agg(cells=pl.len())
                    .sort("cluster", "cp_mechanism", "world_size"),
                    ["cluster", "cp_mechanism", "world_size", "cells", "reason"],
                    numeric=["world_size", "cells"],
                )
            )
    if validation is not None and validation.height:
        page.h2("Validation")
        page.p(
            "measured: CP iterations measured on two H200s against the model of the same cell; rank_local: "
            "each rank's local attention timed on one GPU against the model's compute time of that rank; "
            "ranking: each mechanism's place in a published benchmark at the same world size against its "
            "place in the model. error = modelled / measured - 1."
        )
        page.table(
            _table(
                cp_model.validation_summary(validation),
                ["check", "pass", "comparisons", "median_abs_error", "max_abs_error", "within_15pct"],
                numeric=["comparisons", "median_abs_error", "max_abs_error", "within_15pct"],
            )
        )
        page.chart(charts.cp_model_validation_chart(validation), "No timed comparisons.")
        page.table(_table(validation, list(validation.columns), numeric=list(cp_model.VALIDATION_NUMERIC)))
    return page


def _shapes_page(c: pl.DataFrame) -> Page:
    page = Page("shapes.html", "Shapes", "Head dim and dtype")
    study = queries.shape_study(c)
    page.chart(
        charts.shape_chart(study),
        "No kernel has ok cells at more than one head dim or dtype with everything else equal.",
    )
    wide, variants = queries.shape_table(study)
    if wide.height:
        page.p(
            "TFLOP/s (exact mask area) of each kernel at every measured head dim and dtype, everything else "
            "equal (mask and its number of draws, pass, length, heads, machine); an empty field: no ok cell "
            "of that variant with the same draws (a failed cell is on the Status page). A row's figures may "
            "come from several sweeps (named last), each under its own measurement protocol; repro = the "
            "command that measures the line's cells again."
        )
        page.table(
            _table(
                wide.with_columns(heads=pl.format("{}:{}", "heads_q", "heads_kv")),
                [
                    "kernel",
                    "mask",
                    "mask_variant",
                    "mask_samples",
                    "pass",
                    "seqlen_q",
                    "heads",
                    *variants,
                    "sweeps",
                    "machine",
                    "repro",
                ],
                numeric=["mask_samples", "seqlen_q", *variants],
            )
        )
    return page


def _status_page(
    rows: pl.DataFrame,
    c: pl.DataFrame,
    probe: pl.DataFrame | None = None,
    superseded: pl.DataFrame | None = None,
    stale: pl.DataFrame | None = None,
    checks: pl.DataFrame | None = None,
) -> Page:
    page = Page("status.html", "Status", "Cells that are not ok")
    bad = queries.non_ok(rows, c)
    withheld = queries.partly_failed(c)
    page.p(
        f"{bad.height} (cell, status, reason) lines from {bad.get_column('rows').sum() if bad.height else 0} rows. "
        "None of these is drawn as a speed."
        + (
            f" {withheld} cells have at least one non-ok row; their ok rows are withheld from the charts too."
            if withheld
            else ""
        )
    )
    if bad.height:
        groups = queries.non_ok_groups(bad)
        page.p(
            "Grouped by status, kernel and reason (reasons that differ only in their numbers, such as the bytes "
            "an out-of-memory error names, form one group); open a group for its cells."
        )
        table = _table(groups, ["status", "kernel", "cells", "rows", "masks", "reason"], numeric=["cells", "rows"])
        table.rows = [[*r[:-1], _short(r[-1])] for r in table.rows]
        table.details = [(f"{len(m)} lines", _member_table(m)) for m in groups.get_column("members").to_list()]
        table.details_column = "cells"
        page.table(table)
    if stale is not None and stale.height:
        page.h2("Cells from an earlier version of the spec")
        page.p(
            "Drawn cells whose digest the spec file given to the report no longer has: measured before the spec "
            "changed how they are measured (not measured again yet) or cells it no longer contains. The rows' "
            "timer and iteration counts say how each was measured."
        )
        page.table(_table(stale, ["spec", "spec_file", "sweep", "cells", "rows"], numeric=["cells", "rows"]))
    if superseded is not None and superseded.height:
        page.h2("Superseded measurements")
        page.p(
            "Cells measured again after their spec changed how they are measured (a new digest for the same "
            "cell id): only each cell's latest measurement is drawn. The earlier rows stay in data/all.parquet "
            "and appear in the measurement-time tables below, marked (superseded)."
        )
        old_cells = (
            queries.derive(superseded)
            .group_by("spec", "sweep")
            .agg(
                pl.col("cell_key").n_unique().alias("cells"),
                pl.len().alias("rows"),
                pl.col("timestamp").max().dt.strftime("%Y-%m-%d").alias("last_measured"),
            )
            .sort("spec", "sweep")
        )
        page.table(_table(old_cells, ["spec", "sweep", "cells", "rows", "last_measured"], numeric=["cells", "rows"]))
    # Protocol probes (rows measured only to see where a sweep's time goes) and superseded rows join
    # these tables alone, each under its own label
    extra = [
        f
        for f in (
            probe,
            None
            if superseded is None or not superseded.height
            else superseded.with_columns(spec=pl.col("spec") + " (superseded)"),
        )
        if f is not None
    ]
    timing_rows = pl.concat([rows, *extra], how="diagonal_relaxed") if extra else rows
    _table_section(
        page,
        "Measurement time",
        queries.measurement_time(timing_rows),
        ["spec", "sweep", "cells", "timed_s", "wall_s", "timed_share"],
        "Per sweep: summed timed kernel time (every timed sample) over summed cell wall time (one wall clock per "
        "cell: inputs, masks, compilation, the correctness check, warm-up and timing). Process start-up and "
        "scheduling lie outside the cells, so the sweep's own ratio is lower."
        + (
            " Rows marked (probe FILE) re-measure cells under another protocol to see where the time goes: they "
            "appear in these tables only, never in the charts, and are in data/probes.parquet."
            if probe is not None and probe.height
            else ""
        ),
    )
    shares = [f"{p}_share" for p in queries.PHASES]
    _table_section(
        page,
        "Where the cell wall time goes",
        queries.measurement_phases(timing_rows),
        ["spec", "sweep", "cells", "wall_s", *shares],
        "Per sweep, over the cells whose rows record phase times (result schema 2 on; older rows are left out): "
        "shares of the summed cell wall time. timed: the timed samples; warmup: warm-up calls beyond their "
        "compilation; compile: the first call's compilation; other_timer: the rest of the timer call (fresh "
        "untimed forwards before timed backwards, L2 flushes, launch gaps); check: the correctness check (once "
        "per configuration and process); mask_build: masks and kernel preparation; cooldown: idle pauses before "
        "measurements (repeat.cooldown_s); rest: inputs and everything else inside the cell.",
    )
    _table_section(
        page,
        "Timing intervals",
        queries.intervals(rows),
        ["spec", "sweep", "target", "rows", "full_range", "within", "share", "share_95", "met"],
        "Per sweep and protocol target, over the drawn ok rows: how tight the distribution-free 95% "
        "interval of each median is, on the drawn time (graph replay where captured, else eager). "
        f"within: rows whose interval lies within +-{queries.INTERVAL_GOAL:.0%} of the median (a single "
        "sample has no interval); share: of all rows; share_95: of the rows whose interval reaches 95% "
        "coverage. full_range: rows of fewer than 6 samples (calls over 1 s stop at 3), whose interval "
        "is their whole range and covers the median with 75% probability at 3 samples. met: rows that "
        "reached their own target (the adaptive protocol's ci_target; target none: rows measured "
        "before it).",
    )
    _table_section(
        page,
        "Full-length agreement",
        queries.agreement(rows),
        [
            "spec",
            "sweep",
            "kernel",
            "pass",
            "comparator",
            "rows",
            "lengths",
            "max_out",
            "max_grad",
            "grads_compared",
            "incorrect",
            "reason",
        ],
        "Cells longer than their correctness check (check.max_seqlen) compare each draw, at their own length "
        "and on the same inputs, with a second kernel (the first of check.agree_with that serves the cell): "
        "the output, and dQ, dK and dV on cells with a backward (rows measured since result schema 7). "
        "max_out, max_grad: the largest relative difference ||x - x_other|| / ||x_other|| over the drawn rows; "
        "a difference above the dtype's tolerance makes the row incorrect. comparator none: no listed kernel "
        "served these rows (reason: the first one's why).",
    )
    _table_section(
        page,
        "GPU clocks",
        queries.clocks(timing_rows),
        [
            "spec",
            "sweep",
            "rows",
            "start_mhz",
            "end_mhz",
            "end_p10_mhz",
            "window_mhz",
            "window_min_mhz",
            "power_capped",
            "reasons",
        ],
        "Per sweep, over its ok rows: the SM clock read as each row's measurement began and ended (median, and "
        "the 10th percentile at the end), the median and lowest clock sampled while rows' calls ran (rows "
        "measured since the sampler exists; empty before), the share of rows that ended under the software "
        "power cap, and every throttle reason seen at the end (NVML's names). Many back-to-back calls run under "
        "the power cap at lower clocks than a short burst does: compare timings of different protocols with "
        "their clocks in view.",
    )
    if checks is not None and checks.height:
        page.h2("Timer fidelity")
        page.p(
            "longca's timer (CUDA events, L2 flushed before every call) against a bare triton.testing.do_bench "
            "loop (its defaults: 100 ms warm-up, 500 ms timed) on the same call, alternating in one process, "
            "each case measured over several rounds. ratio: the median over rounds of longca's median / "
            "do_bench's; worst_round: the round furthest from 1; matched_ratio: against do_bench run for as long "
            "as longca's own calls (the GPU clock falls under sustained load, so a longer loop may run slower). "
            f"The goal: within {fidelity.GOAL:.0%}. Every check run is listed, misses included. "
            + fidelity.summary(checks)
        )
        shown = [col for col in fidelity.COLUMNS if col != "device" or checks.get_column("device").is_not_null().any()]
        if checks.get_column("error").is_not_null().any():
            shown.append("error")
        page.table(
            _table(
                checks,
                shown,
                numeric=["seqlen", "rounds", "longca_ms", "do_bench_ms", "ratio", "worst_round", "matched_ratio"],
            )
        )
    return page


def _short(reason: str | None, limit: int = 240) -> str | None:
    """A reason's first line, cut at `limit` characters (CUDA's out-of-memory text runs to a paragraph)."""
    if reason is None:
        return None
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    return first if len(first) <= limit else first[: limit - 1] + "…"


def _member_table(members: list[dict]) -> Table:
    """The cells of one status group: where each ran, without the columns every line shares."""
    cols = ["mask", "pass", "seqlen_q", "shape", "world_size", "cp_mechanism", "machine", "cell_id"]
    keep = [c for c in cols if len({str(m.get(c)) for m in members}) > 1 or c in ("mask", "seqlen_q", "cell_id")]
    if all(m.get("cp_mechanism") is None for m in members):
        keep = [c for c in keep if c not in ("cp_mechanism", "world_size")]
    return Table(columns=keep, rows=[[m.get(c) for c in keep] for m in members], numeric={"seqlen_q", "world_size"})


def _table_section(page: Page, title: str, df: pl.DataFrame, cols: list[str], text: str) -> None:
    """A heading, its explanation and the table, when the table has rows; the numeric columns (and
    those all empty) are set as numbers."""
    if df.height:
        page.h2(title)
        page.p(text)
        page.table(_table(df, cols, numeric=[c for c in cols if df.schema[c].is_numeric() or df.schema[c] == pl.Null]))


def _peers_page(peer: pl.DataFrame, path: Path | None) -> Page:
    page = Page("peers.html", "Peers", "Published figures of other projects")
    page.p(
        "Other people's measurements on other machines, carried as longca's own data file "
        f"({shown_path(path) if path else 'longca/data/peers.csv'}): references, not targets, and never "
        "mixed with measured rows. Charts draw them in grey with their labels, only over GPU rows. "
        "'exact-area value' converts a figure to longca's FLOP convention where the publication's "
        "convention is known (causal_half: S²/2 for a causal mask)."
    )
    cols = [
        "source",
        "kernel",
        "gpu",
        "mask",
        "pass",
        "dtype",
        "seqlen_lo",
        "seqlen_hi",
        "tokens_per_gpu",
        "ws_lo",
        "ws_hi",
        "heads_q",
        "heads_kv",
        "head_dim",
        "block_size",
        "density_lo",
        "density_hi",
        "figure",
        "flop_convention",
        "y_lo",
        "y_hi",
        "note",
    ]
    t = _table(peer, cols, numeric=["y_lo", "y_hi"])
    t.columns = [{"y_lo": "exact-area value (lo)", "y_hi": "exact-area value (hi)"}.get(x, x) for x in t.columns]
    t.numeric = {"exact-area value (lo)", "exact-area value (hi)"}
    page.table(t)
    return page


def _provenance_page(
    rows: pl.DataFrame,
    data: Sequence[Path],
    spec: Path | None,
    spec_name: str,
    libs: dict[str, str],
    all_charts: list[ChartSpec],
    out: Path,
    title: str | None,
    probe: Sequence[Path] = (),
    checks: Sequence[Path] = (),
    local_files: Sequence[Path] = (),
    static_exports: bool = True,
    links: Sequence[tuple[str, str]] = (),
    ceiling_files: Sequence[Path] = (),
    ceiling: pl.DataFrame | None = None,
    model_files: Sequence[Path] = (),
    validation_file: Path | None = None,
) -> Page:
    page = Page("environment.html", "Data", "Environment, provenance and downloads")
    page.h2("Where the numbers came from")
    env = queries.environments(rows)
    page.table(_table(env, ["env_id", *queries.ENV_FACTS, "rows", "run_ids", "first", "last"], numeric=["rows"]))
    if ceiling is not None and ceiling.height:
        page.h2("Measured ceilings")
        page.p(
            "The device's matrix-product rate (2 N^3 FLOPs per N x N product, longca's CUDA timer with its L2 "
            "flush; the median of several rounds, the slowest and fastest round beside it), as "
            "benchmarks/matmul_ceiling.py measured it; the choose page gives each best kernel's share of it."
        )
        page.table(
            _table(
                ceiling,
                ceilings.COLUMNS,
                numeric=["n", "matmul_tflops", "tflops_min", "tflops_max", "matmul_tflops_per_ghz"],
            )
        )
    page.h2("Downloads")
    page.links(
        [
            ("data/all.parquet", "every row (Parquet, longca result schema, zstd)"),
            *([("data/probes.parquet", "protocol probe rows (Status page timing tables only)")] if probe else []),
        ]
    )
    page.p("As CSV (the per-iteration samples are most of the bytes; leave them out):")
    page.pre("duckdb -c \"COPY (SELECT * EXCLUDE (samples_ms) FROM 'data/all.parquet') TO 'all.csv'\"")
    if links:
        page.h2("Comparisons and other pages")
        page.links(list(links))
    page.h2("Reproduce")
    cmd = [
        "longca",
        "report",
        *[a for d in data for a in ("--data", shown_path(d))],
        *[a for d in probe for a in ("--probe", shown_path(d))],
        *[a for d in checks for a in ("--fidelity", shown_path(d))],
        *[a for d in local_files for a in ("--cp-local", shown_path(d))],
        *[a for d in ceiling_files for a in ("--ceiling", shown_path(d))],
        *[a for d in model_files for a in ("--model", shown_path(d))],
        *(["--model-validation", shown_path(validation_file)] if validation_file else []),
    ]
    if spec is not None:
        cmd += ["--spec", shown_path(spec)]
    cmd += ["--out", shown_path(out)]
    if title:
        cmd += ["--title", title]
    if not static_exports:
        cmd += ["--no-exports"]
    for path, text in links:
        cmd += ["--link", f"{text}={path}"]
    page.p("Rebuild these pages from the same rows:")
    page.pre(shlex.join(cmd))
    if spec is not None:
        page.p("Re-measure the spec and rebuild its report with the workflow:")
        page.pre(f"snakemake --cores all reports/{spec_name}/index.html")
    if static_exports:
        page.p(
            "Each chart below is drawn from its own rows; its Vega-Lite spec and CSV are in charts/ and redraw "
            "it exactly (for example with vl-convert or the Vega editor)."
        )
        page.table(
            Table(
                columns=["chart", "rows drawn", "spec", "data"],
                rows=[[c.title, c.query, f"charts/{c.id}.vl.json", f"charts/{c.id}.csv"] for c in all_charts],
            )
        )
    else:
        page.p(
            "Each chart below is drawn from its own rows (in assets/data.js); the links under a chart download "
            "its Vega-Lite spec with those rows, which redraws it exactly, and the rows as CSV."
        )
        page.table(Table(columns=["chart", "rows drawn"], rows=[[c.title, c.query] for c in all_charts]))
    page.h2("Report software")
    page.table(
        Table(
            columns=["library", "version"],
            rows=[["longca", longca.__version__], *sorted([k, v] for k, v in libs.items())],
        )
    )
    page.h2("Spec")
    if spec is not None:
        page.p(f"{shown_path(spec)}:")
        page.pre(Path(spec).read_text(encoding="utf-8"))
    else:
        page.p("No spec file was given to this build.", "note")
    return page


def _write_data(table, out: Path, probe_table=None) -> None:
    """The rows as published downloads: Parquet at zstd's strongest level (per-iteration samples are
    most of the bytes; a CSV of them would be several times larger: the page gives the one-line
    conversion instead)."""
    d = out / "data"
    d.mkdir(parents=True, exist_ok=True)
    write_table(d / "all.parquet", table, level=PUBLISHED_ZSTD_LEVEL)
    if probe_table is not None:
        write_table(d / "probes.parquet", probe_table, level=PUBLISHED_ZSTD_LEVEL)


def _spec_cells(spec_path: Path) -> tuple[str, list] | None:
    """The spec file's name and cells as it now defines them, loaded once for the report (the stale
    cells of the Status page, the current ones the Choose page answers from), or None when the file
    does not load as a spec (it is still shown as given)."""
    from longca.spec.cells import expand
    from longca.spec.load import SpecError, load_spec

    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        print(
            f"warning: {shown_path(spec_path)} does not load as a spec ({exc}); drawn cells are not checked against it",
            file=sys.stderr,
        )
        return None
    return spec.name, expand(spec)


def _stale_cells(rows: pl.DataFrame, spec_path: Path, spec_cells: tuple[str, list]) -> pl.DataFrame:
    """Per sweep, the drawn cells the spec file no longer has (an earlier version of it measured
    them); `spec_cells`: `_spec_cells` of the file."""
    name, cells = spec_cells
    stale = queries.outside_spec(rows, name, {c.digest for c in cells})
    return stale.with_columns(spec=pl.lit(name), spec_file=pl.lit(shown_path(spec_path)))


def build_report(
    data: Sequence[str | Path],
    out: str | Path,
    spec: str | Path | None = None,
    title: str | None = None,
    png: bool = True,
    peers_path: str | Path | None = None,
    probe: Sequence[str | Path] = (),
    fidelity_checks: Sequence[str | Path] = (),
    cp_local_runs: Sequence[str | Path] = (),
    static_exports: bool = True,
    links: Sequence[tuple[str, str]] = (),
    ceiling_files: Sequence[str | Path] = (),
    model_tables: Sequence[str | Path] = (),
    model_validation: str | Path | None = None,
    reruns: Sequence[str | Path] = (),
) -> Built:
    """Write the whole static site for the rows in `data` under `out`; returns what was written.

    `links`: (path relative to `out`, text) of pages beside the report (e.g. `longca compare --html`),
    linked from the Environment page; each must exist when the report is built.
    `static_exports`: also write charts/<id>.{svg,png,vl.json,csv} (PNG unless `png` is False) for
    scripts and papers; the pages offer the same downloads from the drawn chart either way.

    `probe`: rows of protocol probes, shown only in the Status page's measurement-time tables (and
    offered as data/probes.parquet), never drawn: they re-measure cells under another protocol.
    `fidelity_checks`: JSON or Parquet files of benchmarks/timer_fidelity.py, tabled on the Status page.
    `cp_local_runs`: JSON files of benchmarks/cp_rank_local.py, tabled on the CP page.
    `ceiling_files`: JSON files of benchmarks/matmul_ceiling.py: the choose page's share of the
    measured matrix-product rate, and a table on the Environment page.
    `model_tables`: tables of `longca model cp` (source = model), drawn on their own page, never
    among measured rows; `model_validation`: the CSV of `longca model validate`, on the same page.
    `reruns`: result files holding earlier runs of cells of `data` (never drawn): with the current
    rows they measure how far a median moves between runs (longca.report.leases), which the Choose
    page adds to the intervals of two kernels measured in different runs.
    """
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    out, data = Path(out), [Path(d) for d in data]
    spec_path = Path(spec) if spec is not None else None
    if spec_path is not None and not spec_path.is_file():
        raise FileNotFoundError(f"no such spec file: {spec_path}")
    for path, _ in links:
        if not (out / path).is_file():
            raise FileNotFoundError(f"--link {path}: no such file under {out} (write the page there first)")
    table, rows = load.read_rows(data)
    rows, superseded = queries.supersede(rows)  # cells measured again under a newer protocol
    probe = [Path(p) for p in probe]
    probe_table = probe_rows = None
    if probe:  # each file read once; its rows named for it (a probe may re-measure a committed sweep's cells)
        read = [load.read_rows([p]) for p in probe]
        probe_table = pa.concat_tables([t for t, _ in read])
        probe_rows = pl.concat(
            [r.with_columns(spec=pl.col("spec") + f" (probe {p.stem})") for p, (_, r) in zip(probe, read)],
            how="diagonal_relaxed",
        )
    check_files = [Path(p) for p in fidelity_checks]
    checks = fidelity.load_checks(check_files, {p: shown_path(p) for p in check_files}) if check_files else None
    local_files = [Path(p) for p in cp_local_runs]
    local = cp_local.load(local_files, {p: shown_path(p) for p in local_files}) if local_files else None
    ceiling_paths = [Path(p) for p in ceiling_files]
    ceiling = ceilings.load(ceiling_paths, {p: shown_path(p) for p in ceiling_paths}) if ceiling_paths else None
    spec_names = rows.get_column("spec").drop_nulls().unique().sort().to_list()
    spec_name = spec_path.stem if spec_path else (", ".join(spec_names) or "results")
    spec_cells = _spec_cells(spec_path) if spec_path is not None else None
    stale = _stale_cells(rows, spec_path, spec_cells) if spec_cells is not None else None
    current = (spec_cells[0], {c.id for c in spec_cells[1]}) if spec_cells is not None else None
    site_title = title or f"longca: {spec_name}"
    c = queries.cells(rows)
    peer = peers.load(peers_path)
    timings["load+cells"] = time.perf_counter() - t0

    kernels = c.get_column("kernel").drop_nulls().unique().to_list()
    moves = replayed = None
    if reruns:
        _, earlier = load.read_rows([Path(p) for p in reruns])
        moves = leases.between_runs(rows, earlier)
        replayed = leases.between_runs(rows, earlier, time=Time.KERNEL)
    if moves is not None:  # every drawn cell's re-run interval beside its own (tooltips)
        low, high = leases.rerun_interval(
            moves.p95_at(pl.col("median_ms")), pl.col("tflops"), pl.col("tflops_ci_low"), pl.col("tflops_ci_high")
        )
        c = c.with_columns(low.alias("tflops_rerun_low"), high.alias("tflops_rerun_high"))
    choose = _choose_page(c, ceiling, kernels, moves, replayed, current)
    overview, _ = _overview(c, rows, spec_name, stale)
    family = _family_pages(c, peer, local)
    mask_pages = _mask_pages(c, peers.for_masks(peer), kernels)
    model = cp_model.load_models(model_tables) if model_tables else pl.DataFrame()
    validation = cp_model.load_validation(model_validation) if model_validation else None
    model_page = _cp_model_page(model, validation, c)
    drawn = [choose, overview, *mask_pages, *family, model_page]
    all_charts = [ch for p in drawn for ch in p.charts()]
    timings["charts"] = time.perf_counter() - t0

    specs = {ch.id: ch.spec() for ch in all_charts}
    timings["to_dict"] = time.perf_counter() - t0

    out.mkdir(parents=True, exist_ok=True)
    libs = assets.write(out)
    (out / "assets" / "data.js").write_text(assets.data_js(specs), encoding="utf-8")
    _write_data(table, out, probe_table)
    timings["assets+data"] = time.perf_counter() - t0
    # the mask gallery renders in this process while the export workers render the charts
    with ThreadPoolExecutor(1) as pool:
        drawn_gallery = pool.submit(gallery.build, out)
        export.export(all_charts, specs, out, png=png, charts_too=static_exports)
        images, message = drawn_gallery.result()
    timings["exports+gallery"] = time.perf_counter() - t0

    p_gallery = Page("gallery.html", "Gallery", "Mask gallery")
    if images:
        p_gallery.gallery(images)
    else:
        p_gallery.p(message, "note")
    site = [
        choose,
        overview,
        *family,
        model_page,
        p_gallery,
        _status_page(rows, c, probe_rows, superseded, stale, checks),
        _peers_page(peer, Path(peers_path) if peers_path else None),
        _provenance_page(
            rows,
            data,
            spec_path,
            spec_name,
            libs,
            all_charts,
            out,
            title,
            probe,
            check_files,
            local_files,
            static_exports,
            links,
            ceiling_paths,
            ceiling,
            [Path(p) for p in model_tables],
            Path(model_validation) if model_validation else None,
        ),
    ]
    if mask_pages:
        masks_index = Page("masks.html", "Masks", "Per-mask throughput and memory")
        masks_index.links([(p.file, p.nav) for p in mask_pages])
        site.insert(2, masks_index)
    # mask pages: linked from the Masks page, rendered with the same navigation bar
    # pages with nothing but notes (no linear rows: the Linear page) are written, not offered in the nav
    nav = [p for p in site if p.has_content() or p.file in ("index.html", "status.html")]
    written = pages.write(site + mask_pages, out, site_title, specs, static_exports, nav=nav)
    timings["total"] = time.perf_counter() - t0
    (out / "build.json").write_text(
        json.dumps({"pages": [p.name for p in written], "charts": [ch.id for ch in all_charts]}, indent=1)
    )
    return Built(out=out, pages=written, charts=[ch.id for ch in all_charts], timings=timings)


__all__ = ["Built", "build_report", "shown_path"]

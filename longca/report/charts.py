"""Altair charts of the report: each takes query frames and returns a ChartSpec (or None: no data).

Charts draw only the frames they are handed (queries hand them ok cells only). Published peer
figures enter as their own layer with their own marks, labelled, never as measured points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import altair as alt
import polars as pl

from longca.report import queries
from longca.report.repro import repro_expression
from longca.vocab import Time

W, H = 260, 180
DATASET = "rows"
TOOLTIP_ALL = {"content": "data"}
PEER_COLOR = "#555555"
STATUS_COLORS = {
    "supported": "#2e7d32",
    "OOM at some sizes": "#9ccc65",
    "partly unsupported": "#fbc02d",
    "OOM": "#ef6c00",
    "unsupported": "#9e9e9e",
    "failed (error/incorrect/timeout)": "#c62828",
}
# 1024 -> 1K, 1048576 -> 1M: lengths read like the paper's axes
LEN_LABEL = (
    "datum.value >= 1048576 ? format(datum.value / 1048576, '~g') + 'M' : "
    "datum.value >= 1024 ? format(datum.value / 1024, '~g') + 'K' : format(datum.value, '~g')"
)
TOOLTIP = (
    "kernel",
    "mask",
    "mask_variant",
    "pass",
    "seqlen_q",
    "seqlen_k",
    "batch",
    "heads_q",
    "heads_kv",
    "head_dim",
    "head_dim_v",
    "dtype",
    "density",
    "block_size",
    "score_source",
    "world_size",
    "cp_mechanism",
    "cp_degrees",
    "cp_balance",
    "cp_variant",
    "tflops",
    "tflops_kernel",
    "timing",
    "graph_median_ms",
    "tflops_ci_low",
    "tflops_ci_high",
    "tflops_rerun_low",
    "tflops_rerun_high",
    "tflops_draw_low",
    "tflops_draw_high",
    "tokens_per_s",
    "median_ms",
    "ci_low_ms",
    "ci_high_ms",
    "ci_met",
    "p20_ms",
    "p80_ms",
    "peak_mem_gib",
    "comm_share",
    "imbalance_time",
    "imbalance_area",
    "backend",
    "rows",
    "machine",
    "run_ids",
    "cell_id",
    "spec",
    "sweep",
    "git_commit",
)


# The command that measures a drawn cell again, computed in the page from the row's fields (no
# bytes in data.js): every tooltip shows it. Peer figures (no spec) get none.
REPRO_EXPR = repro_expression()


@dataclass
class ChartSpec:
    """One chart: its id (file stem), title, Altair object, caption, the data it draws, its machines."""

    id: str
    title: str
    chart: alt.TopLevelMixin
    caption: str
    data: pl.DataFrame
    machines: list[str] = field(default_factory=list)
    query: str = ""  # which rows, in words, for the reproduce note
    values: list[dict[str, Any]] = field(default_factory=list)  # the drawn rows, as the spec's dataset

    def spec(self) -> dict[str, Any]:
        """The Vega-Lite JSON with its rows attached as a named dataset.

        Rows go in after to_dict: Altair would wrap every value in a schema object and validate it
        (seconds per chart); tests validate the finished specs against the Vega-Lite schema instead.
        """
        spec = self.chart.to_dict(validate=False)
        spec["datasets"] = {DATASET: self.values}
        spec["transform"] = [{"calculate": REPRO_EXPR, "as": "repro"}, *spec.get("transform", [])]
        return spec


# columns a chart may encode besides its tooltip; anything else stays out of the page
_DRAWN = {
    "series",
    "tflops_kernel_draw_low",
    "tflops_kernel_draw_high",
    "attn",
    "shape",
    "panel",
    "label",
    "group",
    "imbalance_of",
    "imbalance",
    "fraction",
    "full_kernel",
    "full_tflops",
    "density_label",
    "block_label",
    "crossover",
    "below",
    "x_lo",
    "x_hi",
    "y_lo",
    "y_hi",
    "source",
    "gpu",
    "peer_shape",
    "figure",
    "flop_convention",
    "note",
    "category",
    "n",
    "ok",
    "unsupported",
    "oom",
    "failed",
    "mech",
    "kernel_label",
    "mask_label",
    "heads",
    "runner_up",
    "runner_up_tflops",
    "margin",
    "kernels",
    "eager_only_faster",
    "time",
    "pct_matmul",
    "lead_clear",
    "lead",
    "runner_up_tflops_ci_high",
    "matmul_tflops",
    "page",
    # the CP model's rows (longca model cp / validate)
    "cluster",
    "tokens_per_gpu",
    "compute_ms",
    "comm_exposed_ms",
    "check",
    "detail",
    "measured",
    "predicted",
    "error",
    "device_name",
}


def records(df: pl.DataFrame) -> list[dict[str, Any]]:
    """JSON-safe rows of the drawn columns: NaN/inf become null (JSON has neither)."""
    keep = [c for c in df.columns if (c in _DRAWN or c in TOOLTIP) and df.schema[c] != pl.Null]
    df = df.select(keep)
    if "cell_id" in keep and df.schema["cell_id"] == pl.String:
        # the id's digest part identifies the cell (its other parts are the tooltip's own columns):
        # most of a chart's bytes otherwise
        df = df.with_columns(pl.col("cell_id").str.extract(r"(@[0-9a-f]+)$").fill_null(pl.col("cell_id")))
    out = df.to_dicts()
    for r in out:
        for k, v in list(r.items()):
            if v is None:
                del r[k]  # absent, not null: the tooltip lists only what the cell has
            elif isinstance(v, float):
                r[k] = float(f"{v:.5g}") if math.isfinite(v) else None
    return out


def _series(df: pl.DataFrame, base: str, within: Sequence[str]) -> pl.DataFrame:
    """A legend label: `base`, plus shape and machine only when a panel holds more than one."""
    parts: list[pl.Expr] = [pl.col(base).cast(pl.String)]
    for extra in ("shape", "machine"):
        if (
            extra in df.columns
            and extra not in within
            and df.group_by(list(within)).agg(pl.col(extra).n_unique()).get_column(extra).max() > 1
        ):
            parts += [pl.lit(" · "), pl.col(extra)]
    return df.with_columns(series=pl.concat_str(parts, ignore_nulls=True))


def _panel(df: pl.DataFrame) -> pl.DataFrame:
    """Facet-row label: the shape, plus the machine when several machines contributed."""
    multi = df.get_column("machine").n_unique() > 1
    expr = pl.concat_str([pl.col("shape"), pl.lit(" on "), pl.col("machine")]) if multi else pl.col("shape")
    return df.with_columns(panel=expr)


def _length_x(data: pl.DataFrame, field_name: str = "seqlen_q", title: str = "sequence length (tokens)") -> alt.X:
    """Log-2 length axis with ticks at the measured lengths (a narrow domain would otherwise get
    ticks such as 68.36K)."""
    ticks = sorted({int(v) for v in data.get_column(field_name).drop_nulls()})
    return alt.X(
        f"{field_name}:Q",
        title=title,
        scale=alt.Scale(type="log", base=2),
        axis=alt.Axis(labelExpr=LEN_LABEL, values=ticks),
    )


def pad_facets(values: list[dict[str, Any]], row: str | None, column: str | None) -> list[dict[str, Any]]:
    """One placeholder record (`_layer` "pad", drawn by no mark) per missing (row, column) pair.

    Vega lays a faceted chart's cells out one after another in a grid of as many columns as there
    are column values: where a row lacks a column (fp8 rows have no backward), every later cell of
    that row would slide into the wrong column, under the wrong heading. A record for each pair
    keeps the grid complete."""
    if not (row and column):
        return values
    rows = {v.get(row) for v in values if v.get(row) is not None}
    cols = {v.get(column) for v in values if v.get(column) is not None}
    have = {(v.get(row), v.get(column)) for v in values}
    pads = [{row: r, column: c, "_layer": "pad"} for r in sorted(rows, key=str) for c in sorted(cols, key=str)]
    return values + [p for p in pads if (p[row], p[column]) not in have]


def _layered_facet(
    layers: Sequence[tuple[str, pl.DataFrame, Callable[[alt.Chart], alt.Chart]]],
    row: str | None,
    column: str | None,
    row_order: list[str] | None = None,
) -> tuple[alt.TopLevelMixin, list[dict[str, Any]]]:
    """Facet several layers that carry different rows: one dataset tagged by `_layer`, one filter per layer.
    row_order: the rows' order where sorting their labels as text would not do (4K before 16K)."""
    values: list[dict[str, Any]] = []
    for name, df, _ in layers:
        values += [{**r, "_layer": name} for r in records(df)]
    values = pad_facets(values, row, column)
    base = alt.Chart()
    charts = [make(base.transform_filter(alt.datum._layer == name)) for name, df, make in layers if df.height]
    layered = alt.layer(*charts, data=alt.NamedData(name=DATASET)).properties(width=W, height=H)
    facet: dict[str, Any] = {}
    if row:
        facet["row"] = alt.Row(
            f"{row}:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left"), sort=row_order or "ascending"
        )
    if column:
        order = ["fwd", "bwd", "fwd_bwd"] if column == "pass" else "ascending"  # forward first, as papers do
        facet["column"] = alt.Column(f"{column}:N", title=None, sort=order)
    return (layered.facet(**facet).resolve_scale(y="independent") if facet else layered), values


def _lines(
    x: alt.X,
    y: alt.Y,
    color: str = "series",
    dash: str | None = None,
    dash_shapes: bool = False,
    scale: alt.Scale | None = None,
) -> Callable[[alt.Chart], alt.Chart]:
    """Measured lines with points, a legend that selects series, and full-parameter tooltips.
    dash_shapes: the `dash` field also picks the point shape, for variants measured at one x only
    (a lone point has no line to dash)."""

    def make(base: alt.Chart) -> alt.Chart:
        pick = alt.selection_point(fields=[color], bind="legend", name="pick")
        enc: dict[str, Any] = dict(
            x=x,
            y=y,
            # every entry and its whole label: a legend that ends in "…6 entries" hides series
            color=alt.Color(
                f"{color}:N", title=None, scale=scale or alt.Undefined, legend=alt.Legend(symbolLimit=0, labelLimit=0)
            ),
            opacity=alt.when(pick).then(alt.value(1.0)).otherwise(alt.value(0.12)),
        )
        if dash:
            if dash_shapes:  # one legend, the shapes'; the dashes follow it
                enc["strokeDash"] = alt.StrokeDash(f"{dash}:N", legend=None)
                enc["shape"] = alt.Shape(f"{dash}:N")
            else:
                enc["strokeDash"] = alt.StrokeDash(f"{dash}:N")
            enc["detail"] = alt.Detail(f"{dash}:N")
        # the tooltip shows every field of the point: records() already chose the cell's parameters.
        # (Per-field tooltip encodings cost Altair ~1 s of schema matching per chart.)
        return base.mark_line(point=True, tooltip=TOOLTIP_ALL).encode(**enc).add_params(pick)

    return make


def _peer_layers(peers: pl.DataFrame, x_title: str) -> list[tuple[str, pl.DataFrame, Callable[[alt.Chart], alt.Chart]]]:
    """Published figures: a grey box (or bar) for ranges, a grey diamond for single figures."""
    if peers.is_empty():
        return []
    is_point = peers.filter((pl.col("x_lo") == pl.col("x_hi")) & (pl.col("y_lo") == pl.col("y_hi")))
    ranges = peers.filter(~((pl.col("x_lo") == pl.col("x_hi")) & (pl.col("y_lo") == pl.col("y_hi"))))

    def box(base: alt.Chart) -> alt.Chart:
        return base.mark_rect(
            color=PEER_COLOR, opacity=0.15, stroke=PEER_COLOR, strokeWidth=2, tooltip=TOOLTIP_ALL
        ).encode(x=alt.X("x_lo:Q", title=x_title), x2="x_hi:Q", y="y_lo:Q", y2="y_hi:Q")

    def point(base: alt.Chart) -> alt.Chart:
        return base.mark_point(shape="diamond", filled=True, color=PEER_COLOR, size=70, tooltip=TOOLTIP_ALL).encode(
            x=alt.X("x_lo:Q", title=x_title), y="y_lo:Q"
        )

    # no text beside the marks: labels of nearby figures overlap; the tooltip names each one
    return [("peer_range", ranges, box), ("peer_point", is_point, point)]


def shape_order(df: pl.DataFrame) -> list[str]:
    """Panels of shapes, the most measured first (ties by name)."""
    counts = df.group_by("shape").len().sort(["len", "shape"], descending=[True, False])
    return counts.get_column("shape").to_list()


def mask_metric(
    mask: str, cells: pl.DataFrame, metric: str, peers: pl.DataFrame, kernels: Sequence[str] = ()
) -> ChartSpec | None:
    """Throughput (TFLOP/s) or peak memory (GiB) against length for one mask: one panel per shape
    (heads, head dim, dtype) and pass, one line per kernel in its report-wide colour."""
    df = cells.filter(pl.col("mask") == mask)
    if metric == "peak_mem_gib":
        df = df.filter(pl.col("peak_mem_gib").is_not_null())
    if df.is_empty():
        return None
    df = _series(df, "kernel", ["pass", "shape"]).sort("series", "seqlen_q")
    title = "TFLOP/s (exact mask area)" if metric == "tflops" else "peak memory (GiB)"
    throughput = metric == "tflops"
    # TFLOP/s are drawn at kernel time by default (graph replay where captured), eager one click away
    y = alt.Y(f"{SHOWN if throughput else metric}:Q", title=title)
    plain = df.get_column("series").equals(df.get_column("kernel"))  # one machine: series are kernel names
    scale = kernel_scale(kernels) if kernels and plain else None
    shown = _shown_time if throughput else (lambda make: make)
    layers = [("measured", df, shown(_lines(_length_x(df), y, scale=scale)))]
    spread = df.filter(pl.col("tflops_draw_high") > pl.col("tflops_draw_low")) if throughput else df.clear()
    if spread.height:
        # the median over mask draws is the line; the band spans the draws (lowest to highest)
        x = _length_x(df)

        def band(base: alt.Chart) -> alt.Chart:
            return base.mark_area(opacity=0.15, tooltip=TOOLTIP_ALL).encode(
                x=x,
                y=alt.Y(f"{SHOWN}_draw_low:Q", title=title),
                y2=f"{SHOWN}_draw_high:Q",
                color=alt.Color("series:N", title=None, scale=scale or alt.Undefined, legend=None),
                detail="series:N",
            )

        layers.insert(0, ("draws", df.filter(pl.col("tflops_draw_high").is_not_null()), _shown_time(band)))
    if metric == "tflops" and not peers.is_empty():
        panels = df.select("mask", "pass", "attn", "shape", "head_dim", "dtype").unique()
        shown = (
            peers.drop("shape", strict=False)
            .join(panels, on=["mask", "pass", "attn"], suffix="_panel")
            .filter(
                (pl.col("head_dim").is_null() | (pl.col("head_dim") == pl.col("head_dim_panel")))
                # 16-bit figures (fp16 or bf16) beside 16-bit panels, fp8 beside fp8
                & (
                    pl.col("dtype").is_null()
                    | (pl.col("dtype").str.contains("8") == pl.col("dtype_panel").str.contains("8"))
                )
            )
            .drop("head_dim_panel", "dtype_panel")
            .sort("shape", "pass", "source", "x_lo", "y_lo")
        )
        layers += _peer_layers(shown, "sequence length (tokens)")
    chart, values = _layered_facet(layers, row="shape", column="pass", row_order=shape_order(df))
    if throughput:
        chart = chart.add_params(TIME_PARAM)
    what = "throughput" if metric == "tflops" else "memory"
    peer_note = (
        " Grey diamonds and boxes: published figures of other projects at a matching shape (hover for the source)."
        if metric == "tflops" and not peers.is_empty()
        else ""
    )
    return ChartSpec(
        id=f"mask-{slug(mask)}-{what}",
        title=f"{mask}: {what} against sequence length",
        chart=chart,
        data=df,
        machines=queries.machines(df),
        values=values,
        caption=f"{title} of every ok cell on mask {mask}; columns: pass, rows: shape (attention type, heads "
        "q:kv, head dim, dtype). Click a legend entry to pick kernels (shift-click for several)."
        + (" Lines: the median over mask draws; shaded: the lowest to the highest draw." if spread.height else "")
        + (TIME_NOTE if throughput else "")
        + peer_note,
        query=f"status ok, world_size 1, kernel_family softmax, mask {mask}",
    )


# Which time a throughput chart draws: the kernel's (the cell's pass replayed from a CUDA graph, no
# host launch time, where it was captured: the row's `timing`) by default, the eager call's one click
# away. Both are in every point's tooltip.
SHOWN = "tflops_shown"
TIME_PARAM = alt.param(
    name="time",
    value=str(Time.KERNEL),
    bind=alt.binding_radio(options=[str(t) for t in Time], labels=[f"{t} time" for t in Time], name="time: "),
)
TIME_NOTE = (
    " TFLOP/s at kernel time by default: cells replayed from a CUDA graph where their pass could be"
    " captured (no host launch time; the tooltip's timing says which), eager time elsewhere; the buttons"
    " above switch every panel to eager time."
)


def _shown_time(make: Callable[[alt.Chart], alt.Chart]) -> Callable[[alt.Chart], alt.Chart]:
    """A layer that draws `tflops_shown*`: the kernel-time or eager columns, as the `time` buttons say."""
    pick = f"time == '{Time.KERNEL}'"

    def shown(base: alt.Chart) -> alt.Chart:
        return make(
            base.transform_calculate(
                **{
                    SHOWN: f"{pick} ? datum.tflops_kernel : datum.tflops",
                    f"{SHOWN}_draw_low": f"{pick} ? datum.tflops_kernel_draw_low : datum.tflops_draw_low",
                    f"{SHOWN}_draw_high": f"{pick} ? datum.tflops_kernel_draw_high : datum.tflops_draw_high",
                }
            )
        )

    return shown


# Kernels keep one colour on every chart that takes `kernel_scale` (the report passes every kernel of
# its rows, sorted): Vega's tableau20, its saturated half first, so neighbours in the domain differ.
_KERNEL_COLORS = [
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#439894", "#b79a20", "#d67195", "#9e765f",
    "#79706e", "#9ecae9", "#ffbf79", "#88d27a", "#ff9d98", "#d6a5c9", "#83bcb6", "#f2cf5b", "#fcbfd2",
    "#d8b5a5", "#bab0ac",
]  # fmt: skip


def kernel_scale(kernels: Sequence[str]) -> alt.Scale:
    """One colour per kernel name, the same on every chart that takes it (sorted names, fixed order)."""
    domain = sorted(set(kernels))
    return alt.Scale(domain=domain, range=[_KERNEL_COLORS[i % len(_KERNEL_COLORS)] for i in range(len(domain))])


CHOOSE_ALL = "all"


def choose_chart(best: pl.DataFrame, kernels: Sequence[str]) -> ChartSpec | None:
    """The first page: per mask x length, the fastest kernel for the shape picked in the dropdowns
    (heads, head dim, dtype, pass), its TFLOP/s, its margin over the runner-up, and (with a measured
    matmul ceiling) its share of that rate; each cell links to the mask's page. Where `best` holds
    rankings at both times (its `time` column, queries.at_time), the `time` buttons pick one, kernel
    time first."""
    if best.is_empty():
        return None
    times = set(best.get_column("time")) if "time" in best.columns else set()
    at_kernel = pl.col("time") == str(Time.KERNEL) if times else pl.lit(False)
    has_ceiling = "pct_matmul" in best.columns
    sparse = pl.col("mask").is_in(queries.SPARSE_MASKS)
    df = best.with_columns(
        page=pl.when(sparse)
        .then(pl.lit("sparse.html"))
        .otherwise(pl.col("mask").map_elements(lambda m: f"mask-{slug(m)}.html", pl.String)),
        # three lines a square: the winner, its TFLOP/s and lead, the runner-up it leads
        label=pl.concat_str(
            [
                pl.col("kernel"),
                # "*": a kernel timed eagerly only (never captured) was faster here at eager time
                pl.when(at_kernel & (pl.col("eager_only_faster") > 0)).then(pl.lit(" *")).otherwise(pl.lit("")),
                pl.lit("\n"),
                _tflops_text(pl.col("tflops")),
                pl.when(pl.col("margin").is_null())
                .then(pl.lit(" · alone\n "))
                .otherwise(
                    pl.format(
                        " · {}+{}%\nvs {}",
                        # "~": the two kernels' 95% intervals overlap (a lead within the noise)
                        pl.when(pl.col("lead_clear").fill_null(False)).then(pl.lit("")).otherwise(pl.lit("~")),
                        (pl.col("margin") * 100).round(0).cast(pl.Int64),
                        # a long name cut to the square (the tooltip has it whole)
                        pl.when(pl.col("runner_up").str.len_chars() > 14)
                        .then(pl.col("runner_up").str.slice(0, 13) + "…")
                        .otherwise(pl.col("runner_up")),
                    )
                ),
            ]
        ),
        lead=pl.col("margin"),
    )

    def options(col: str, prefer: Any) -> tuple[list[Any], Any]:
        opts = sorted(df.get_column(col).unique().to_list(), key=lambda v: (str(type(v)), v))
        return opts, prefer if prefer in opts else opts[0]

    passes = [p for p in ("fwd", "bwd", "fwd_bwd") if p in set(df.get_column("pass"))]
    main = main_shape(df)  # the page opens on the shape with the most squares
    heads, heads0 = options("heads", main["heads"])
    dims, dim0 = options("head_dim", main["head_dim"])
    dtypes, dtype0 = options("dtype", main["dtype"])
    p_heads = alt.param(name="heads", value=heads0, bind=alt.binding_select(options=heads, name="heads (q:kv) "))
    p_dim = alt.param(name="head_dim", value=dim0, bind=alt.binding_select(options=dims, name="head dim "))
    p_dtype = alt.param(name="dtype", value=dtype0, bind=alt.binding_select(options=dtypes, name="dtype "))
    p_pass = alt.param(
        name="pass_", value=CHOOSE_ALL, bind=alt.binding_select(options=[CHOOSE_ALL, *passes], name="pass ")
    )
    base = alt.Chart().encode(
        x=alt.X("seqlen_q:O", title="sequence length (tokens)", axis=alt.Axis(labelExpr=LEN_LABEL, orient="top")),
        y=alt.Y("mask_label:N", title=None, axis=alt.Axis(labelLimit=400)),
    )
    # only the fields these squares have (no matmul share without a measured ceiling)
    tooltip = [t for t in CHOOSE_TOOLTIP if t.shorthand.split(":")[0] in {*df.columns, "repro"}]
    # the legend below the squares, in columns: beside them it was clipped on screens under 1920 px
    legend = alt.Legend(symbolLimit=0, orient="bottom", columns=4, title="fastest kernel")
    rect = base.mark_rect(stroke="white", opacity=0.6).encode(
        color=alt.Color("kernel:N", title="best kernel", scale=kernel_scale(kernels), legend=legend),
        href="page:N",
        tooltip=tooltip,
    )
    text = base.mark_text(fontSize=9, lineBreak="\n", color="black").encode(
        text="label:N", href="page:N", tooltip=tooltip
    )
    layered = alt.layer(rect, text, data=alt.NamedData(name=DATASET)).properties(
        width=alt.Step(88), height=alt.Step(46)
    )
    both = len(times) > 1
    chart = (
        layered.facet(
            row=alt.Row("pass:N", title=None, sort=passes, header=alt.Header(labelAngle=0, labelAlign="left"))
        )
        .add_params(p_heads, p_dim, p_dtype, p_pass, *([TIME_PARAM] if both else []))
        .transform_filter(
            f"datum.heads == heads && datum.head_dim == head_dim && datum.dtype == dtype"
            f" && (pass_ == '{CHOOSE_ALL}' || datum.pass == pass_)" + (" && datum.time == time" if both else "")
        )
    )
    machines = queries.machines(df)
    if both:
        at_time = (
            "at kernel time by default (its pass replayed from a CUDA graph where it was captured, no host "
            "launch time; eager time elsewhere: the tooltip's timing says which; '*': a kernel measured there "
            "without a capture, so competing at its eager time, was faster at eager time and may lead once "
            "replayed), at eager time (each call launched from Python) with the time buttons; the two can rank "
            "kernels differently"
        )
    else:
        at_time = f"at {next(iter(times), Time.EAGER)} time"
    ceiling = (
        " and its share of the device's measured matrix-product rate in the same dtype (`pct_matmul`)"
        if has_ceiling
        else ""
    )
    return ChartSpec(
        id="choose",
        title="Fastest kernel for your shape",
        chart=chart,
        data=df,
        values=records(df),
        machines=machines,
        query="fastest ok single-device softmax kernel per mask, length, heads, head dim, dtype, pass",
        caption="Pick heads, head dim, dtype and pass above. Each square: the fastest kernel that ran (ok) at that "
        f"mask and length {at_time}, its TFLOP/s (exact mask area) "
        "and its lead in per cent over the runner-up it names ('alone': "
        "no other kernel ran there; '~': the 95% intervals of the two medians overlap, so the lead is within "
        f"the timing noise); the tooltip names the runner-up, both intervals{ceiling}, the command that measures "
        "the cell again and the commit it was measured at. Click a square for the mask's page.",
    )


def _most_common(df: pl.DataFrame, col: str) -> Any:
    return df.get_column(col).value_counts(sort=True).get_column(col)[0]


def main_shape(best: pl.DataFrame) -> dict[str, Any]:
    """The (heads, head dim, dtype) with the most squares on the choose page: a report opens on the
    shape its spec is about (the default CPU spec's one bfloat16 cell is not its main shape), ties
    going to head dim 128 and bfloat16, then the most common heads."""
    counts = best.group_by("heads", "head_dim", "dtype").len()
    common = best.get_column("heads").value_counts().rename({"count": "heads_rows"})
    counts = counts.join(common, on="heads").with_columns(
        d128=(pl.col("head_dim") == 128).cast(pl.Int8), bf16=(pl.col("dtype") == "bfloat16").cast(pl.Int8)
    )
    top = counts.sort(["len", "d128", "bf16", "heads_rows", "heads"], descending=[True, True, True, True, False])
    return top.row(0, named=True)


def _tflops_text(col: pl.Expr) -> pl.Expr:
    """TFLOP/s as a square prints it: whole numbers from 10, three significant digits below (a CPU's
    0.031 is not 0)."""
    return (
        pl.when(col >= 10)
        .then(col.round(0).cast(pl.Int64).cast(pl.String))
        .otherwise(col.map_elements(lambda v: f"{v:.3g}", pl.String))
    )


# The choose page's tooltip: its fields named for people, the most useful first (every column was
# shown before, raw, taller than a screen).
CHOOSE_TOOLTIP = [
    alt.Tooltip("mask_label:N", title="mask"),
    alt.Tooltip("seqlen_q:Q", title="sequence length (tokens)", format=","),
    alt.Tooltip("pass:N", title="pass"),
    alt.Tooltip("kernel:N", title="fastest kernel"),
    alt.Tooltip("tflops:Q", title="its TFLOP/s (exact mask area)", format=".4~g"),
    alt.Tooltip("median_ms:Q", title="its median time (ms)", format=".4~g"),
    alt.Tooltip("timing:N", title="timed by"),
    alt.Tooltip("runner_up:N", title="runner-up"),
    alt.Tooltip("runner_up_tflops:Q", title="runner-up's TFLOP/s", format=".4~g"),
    alt.Tooltip("lead:Q", title="lead over the runner-up", format="+.1%"),
    alt.Tooltip("lead_clear:N", title="lead beyond both 95% intervals"),
    alt.Tooltip("kernels:Q", title="kernels that ran here"),
    alt.Tooltip("pct_matmul:Q", title="share of the measured matmul rate", format=".0%"),
    alt.Tooltip("machine:N", title="measured on"),
    alt.Tooltip("repro:N", title="measure it again"),
    alt.Tooltip("git_commit:N", title="at commit"),
]


def fraction_chart(frac: pl.DataFrame) -> ChartSpec | None:
    if frac.is_empty():
        return None
    df = _panel(frac).sort("mask", "seqlen_q")
    y = alt.Y("fraction:Q", title="best TFLOP/s ÷ best full-mask TFLOP/s", axis=alt.Axis(format="%"))
    layers = [("measured", df, _lines(_length_x(df), y, color="mask"))]
    chart, values = _layered_facet(layers, row="panel", column="pass")
    return ChartSpec(
        id="overview-fraction",
        title="Mask efficiency: fraction of the best full-mask throughput",
        chart=chart,
        values=values,
        data=df,
        machines=queries.machines(df),
        query="best ok kernel per (mask, pass, length, shape) over the best on mask full",
        caption="Per mask, the best kernel's TFLOP/s (exact mask-area FLOPs) as a fraction of the "
        "best full-mask TFLOP/s at the same pass, length and shape; lengths where a kernel "
        "that wins elsewhere has not run are left out.",
    )


def support_chart(matrix: pl.DataFrame) -> ChartSpec | None:
    if matrix.is_empty():
        return None
    base = alt.Chart(alt.NamedData(name=DATASET)).encode(
        x=alt.X("mask:N", title=None, axis=alt.Axis(labelAngle=-40)), y=alt.Y("kernel:N", title=None)
    )
    rect = base.mark_rect(stroke="white", tooltip=TOOLTIP_ALL).encode(
        color=alt.Color(
            "category:N",
            title="measured status",
            scale=alt.Scale(domain=list(STATUS_COLORS), range=list(STATUS_COLORS.values())),
        )
    )
    text = base.mark_text(fontSize=9, color="black").encode(text="label:N")
    chart = alt.layer(rect, text).properties(width=alt.Step(64), height=alt.Step(24))
    return ChartSpec(
        id="overview-support",
        title="Kernel × mask support, measured",
        chart=chart,
        data=matrix,
        values=records(matrix),
        query="every single-device cell, by status",
        caption="Each square summarises the measured statuses of every cell of that kernel and mask; "
        "'8/10 ok' means 8 of its 10 cells ran and passed the correctness check.",
    )


def sparse_chart(cells: pl.DataFrame, peers: pl.DataFrame, x: str) -> ChartSpec | None:
    """Block-sparse throughput against density (panels: block size), block size (panels: density) or
    sequence length (panels: block size; one line per kernel and density)."""
    if cells.is_empty():
        return None
    df = cells.with_columns(
        density_label=pl.format("density {}", pl.col("density").round(2)),
        # variable blocks have no single block size: their own panel, never "block null"
        block_label=pl.when(pl.col("block_size").is_null())
        .then(pl.lit("variable blocks"))
        .otherwise(pl.format("block {}", pl.col("block_size"))),
        sparse_kind=pl.when(pl.col("mask") == "variable_block_sparse").then(pl.lit(" variable")).otherwise(pl.lit("")),
    ).with_columns(
        kernel_label=pl.concat_str(
            [pl.col("kernel"), pl.col("sparse_kind"), pl.lit(" · "), pl.col("score_source").fill_null("?")]
        )
    )
    panel = "density_label" if x == "block_size" else "block_label"
    df = _series(df, "kernel_label", ["pass", panel]).sort("series", x)
    if x == "seqlen_q":
        xe = _length_x(df)
    elif x == "density":
        xe = alt.X("density:Q", title="density (fraction of blocks kept)")
    else:
        xe = alt.X("block_size:Q", title="block size", scale=alt.Scale(type="log", base=2))
    dash = "density_label" if x == "seqlen_q" else "seqlen_q"
    y = alt.Y(f"{SHOWN}:Q", title="TFLOP/s (exact kept area)")  # kernel time first, as on the mask pages
    layers = [("measured", df, _shown_time(_lines(xe, y, dash=dash)))]
    if not peers.is_empty() and x != "seqlen_q":  # published sparse figures are at one length each
        p = peers.with_columns(block_label=pl.format("block {}", pl.col("block_size")))
        if x == "density":
            p = p.filter(pl.col("density_lo").is_not_null()).with_columns(
                x_lo=pl.col("density_lo"), x_hi=pl.col("density_hi")
            )
            p = p.join(df.select("pass", "block_label").unique(), on=["pass", "block_label"], how="semi")
        else:
            p = p.filter(pl.col("density_lo").is_null() & pl.col("block_size").is_not_null()).with_columns(
                x_lo=pl.col("block_size").cast(pl.Float64),
                x_hi=pl.col("block_size").cast(pl.Float64),
                density_label=pl.lit(None, pl.String),
            )
            p = p.join(df.select("pass").unique(), on="pass", how="semi")
            # a figure without a density belongs to no density panel: repeat it in each, labelled
            p = p.drop("density_label").join(df.select("pass", "density_label").unique(), on="pass")
        # joins and unique() leave row order free: sort, so that a rebuild from the same rows is identical
        p = p.sort(
            [
                c
                for c in ("pass", "density_label", "block_label", "source", "kernel", "x_lo", "x_hi", "y_lo")
                if c in p.columns
            ],
            nulls_last=True,
        )
        layers += _peer_layers(p, xe.to_dict().get("title", x))
    chart, values = _layered_facet(layers, row="pass", column=panel)
    chart = chart.add_params(TIME_PARAM)
    name = {"seqlen_q": "sequence length"}.get(x, x.replace("_", " "))
    return ChartSpec(
        id=f"sparse-{x.replace('_', '-')}",
        title=f"Block-sparse throughput against {name}",
        chart=chart,
        values=values,
        data=df,
        machines=queries.machines(df),
        query="status ok, world_size 1, masks block_sparse and variable_block_sparse",
        caption=f"Dashed lines distinguish {'densities' if x == 'seqlen_q' else 'sequence lengths'}; "
        "the legend names kernel, mask kind and block score source (random or importance)." + TIME_NOTE,
    )


def cp_chart(cells: pl.DataFrame, peers: pl.DataFrame, kind: str) -> ChartSpec | None:
    """Context parallelism: per-GPU TFLOP/s against world size or length, exposed-comm share, imbalance."""
    df = cells
    if kind == "comm":
        df = df.filter(pl.col("comm_share").is_not_null())
    if kind == "imbalance":
        df = df.filter(pl.col("imbalance_time").is_not_null() | pl.col("imbalance_area").is_not_null())
    if df.is_empty():
        return None
    df = df.with_columns(
        mech=pl.concat_str([pl.col("cp_mechanism").fill_null("?"), pl.lit(" ("), pl.col("kernel"), pl.lit(")")])
    )
    df = _series(df, "mech", ["mask", "pass"]).sort("series", "world_size", "seqlen_q")
    ws_x = alt.X("world_size:Q", title="GPUs (world size)", scale=alt.Scale(type="log", base=2))
    layers: list[tuple[str, pl.DataFrame, Callable[[alt.Chart], alt.Chart]]]
    if kind == "world":
        layers = [("measured", df, _lines(ws_x, alt.Y("tflops:Q", title="TFLOP/s per GPU"), dash="seqlen_q"))]
        if not peers.is_empty():
            p = peers.filter(pl.col("ws_lo").is_not_null()).with_columns(
                x_lo=pl.col("ws_lo").cast(pl.Float64), x_hi=pl.col("ws_hi").cast(pl.Float64)
            )
            layers += _peer_layers(
                p.join(df.select("mask", "pass").unique(), on=["mask", "pass"], how="semi"), "GPUs (world size)"
            )
        title, caption = "Per-GPU throughput against world size", "Dashed lines distinguish global sequence lengths."
    elif kind == "length":
        layers = [
            (
                "measured",
                df,
                _lines(
                    _length_x(df, title="global sequence length (tokens)"),
                    alt.Y("tflops:Q", title="TFLOP/s per GPU"),
                    dash="world_size",
                ),
            )
        ]
        title, caption = "Per-GPU throughput against length", "Dashed lines distinguish world sizes."
    elif kind == "comm":
        y = alt.Y("comm_share:Q", title="exposed communication / iteration time", axis=alt.Axis(format="%"))
        layers = [("measured", df, _lines(ws_x, y, dash="seqlen_q"))]
        title, caption = (
            "Exposed-communication share",
            "Communication time not hidden behind compute, as a share of the iteration.",
        )
    else:
        long = df.unpivot(
            on=["imbalance_time", "imbalance_area"],
            index=[c for c in df.columns if c not in ("imbalance_time", "imbalance_area")],
            variable_name="imbalance_of",
            value_name="imbalance",
        ).filter(pl.col("imbalance").is_not_null())
        long = long.with_columns(pl.col("imbalance_of").str.replace("imbalance_", ""))
        y = alt.Y("imbalance:Q", title="max rank / mean rank", scale=alt.Scale(zero=False))
        layers = [("measured", long, _lines(ws_x, y, dash="imbalance_of"))]
        title, caption = (
            "Per-rank imbalance",
            "Solid/dashed: time and attended area of the slowest / largest rank over the mean rank.",
        )
    chart, values = _layered_facet(layers, row="mask", column="pass")
    return ChartSpec(
        id=f"cp-{kind}",
        title=title,
        chart=chart,
        values=values,
        data=df,
        machines=queries.machines(df),
        caption=caption,
        query="status ok, world_size > 1",
    )


def linear_chart(series: pl.DataFrame, crossovers: pl.DataFrame) -> ChartSpec | None:
    if series.is_empty():
        return None
    y = alt.Y("tokens_per_s:Q", title="tokens/s", scale=alt.Scale(type="log"))
    layers = [("measured", series, _lines(_length_x(series), y))]
    # One dashed rule per kernel, in the kernel's line colour (labels would pile up where several
    # kernels overtake at the same length; the table below the chart names each crossover).
    marks = crossovers.filter(pl.col("crossover").is_not_null()).with_columns(series=pl.col("kernel"))
    if marks.height:

        def rule(base: alt.Chart) -> alt.Chart:
            return base.mark_rule(strokeDash=[4, 3], strokeWidth=1.5, tooltip=TOOLTIP_ALL).encode(
                x=alt.X("crossover:Q", title="sequence length (tokens)"), color=alt.Color("series:N", title=None)
            )

        layers += [("crossover", marks, rule)]
    chart, values = _layered_facet(layers, row="group", column=None)
    return ChartSpec(
        id="linear-tokens",
        title="Linear attention against the best softmax kernel",
        chart=chart,
        values=values,
        data=series,
        machines=queries.machines(series),
        query="status ok, world_size 1, kernel_family linear, "
        "and the best softmax kernel on the same mask, pass and shape",
        caption="Tokens/s against length; a dashed rule in a kernel's colour marks the first measured "
        "length from which that linear kernel stays ahead of the best softmax kernel (the "
        "fastest softmax kernel per length, at lengths where every softmax kernel has a row).",
    )


def shape_chart(study: pl.DataFrame) -> ChartSpec | None:
    """TFLOP/s against head dim, a line per kernel and dtype; panels: mask, heads and length (and the
    machine when several), columns: pass."""
    if study.is_empty():
        return None
    length = (
        pl.when(pl.col("seqlen_q") >= 1024)
        .then(pl.format("{}K", pl.col("seqlen_q") // 1024))
        .otherwise(pl.col("seqlen_q").cast(pl.String))
    )
    variant = (
        pl.when(pl.col("mask_variant").is_null() | (pl.col("mask_variant") == "default"))
        .then(pl.lit(""))
        .otherwise(pl.format(" ({})", pl.col("mask_variant")))
    )
    parts = [
        pl.col("mask"),
        variant,
        pl.lit(" · "),
        pl.col("attn"),
        pl.lit(" "),
        pl.col("heads_q").cast(pl.String),
        pl.lit(":"),
        pl.col("heads_kv").cast(pl.String),
        pl.lit(" · S="),
        length,
    ]
    if study.get_column("machine").n_unique() > 1:
        parts += [pl.lit(" on "), pl.col("machine")]
    df = study.with_columns(group=pl.concat_str(parts), series=pl.col("kernel")).sort("group", "series", "head_dim")
    order = (
        df.sort("mask", "mask_variant", "attn", "heads_q", "heads_kv", "seqlen_q", "machine", nulls_last=True)
        .get_column("group")
        .unique(maintain_order=True)
        .to_list()
    )
    x = alt.X("head_dim:O", title="head dim", sort="ascending", axis=alt.Axis(labelAngle=0))
    y = alt.Y("tflops:Q", title="TFLOP/s (exact mask area)")
    chart, values = _layered_facet(
        [("measured", df, _lines(x, y, dash="dtype", dash_shapes=True))], row="group", column="pass", row_order=order
    )
    return ChartSpec(
        id="shapes-head-dim",
        title="Head dim and dtype: throughput by head dim, one panel per length",
        chart=chart.properties(title="TFLOP/s (exact mask area) by head dim"),
        values=values,
        data=df,
        machines=queries.machines(df),
        query="status ok, world_size 1, softmax; cells of one kernel, mask, pass, length and heads "
        "at several (head dim, dtype), at the lengths with the most such variants",
        caption="A line per kernel (colour) and dtype (dash and point shape) across head dims; each panel holds one "
        "mask, head counts and length. Click a legend entry to pick kernels.",
    )


def slug(text: str) -> str:
    """A file-name-safe stem: lower-case letters, digits, '-' and '_' only."""
    s = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_") else "-" for ch in str(text).lower())
    return s.strip("-") or "x"


def cp_model_chart(lines: pl.DataFrame, measured: pl.DataFrame) -> ChartSpec | None:
    """Modelled per-GPU TFLOP/s against world size, a line per CP mechanism (each at its fastest
    modelled variant); measured CP cells of the same mask and pass as black points. Panels: mask,
    tokens per GPU and cluster; columns: pass."""
    if lines.is_empty():
        return None
    ws_x = alt.X("world_size:Q", title="GPUs (world size)", scale=alt.Scale(type="log", base=2))
    y = alt.Y("tflops:Q", title="TFLOP/s per GPU (modelled)")
    layers: list[tuple[str, pl.DataFrame, Callable[[alt.Chart], alt.Chart]]] = [("model", lines, _lines(ws_x, y))]
    if not measured.is_empty():

        def points(base: alt.Chart) -> alt.Chart:
            return base.mark_point(shape="diamond", filled=True, size=70, color="black", tooltip=TOOLTIP_ALL).encode(
                x=ws_x, y=y
            )

        layers.append(("measured", measured, points))
    chart, values = _layered_facet(layers, row="panel", column="pass")
    return ChartSpec(
        id="cp-model",
        title="CP at scale (modelled): per-GPU throughput against world size",
        chart=chart,
        values=values,
        data=lines,
        caption="Lines: the CP model (longca model cp) on the cluster named in the panel, each mechanism "
        "at its fastest modelled degrees; black diamonds: measured CP cells of the same mask and pass "
        "(their GPUs and tokens per GPU in the tooltip).",
        query="model tables (source = model), status ok; measured rows with world_size > 1",
    )


def cp_model_validation_chart(v: pl.DataFrame) -> ChartSpec | None:
    """Predicted against measured time, log-log, one point per comparison, the diagonal for reference."""
    d = v.filter(pl.col("check") != "ranking").with_columns(series=pl.col("check"), label=pl.col("detail"))
    if d.is_empty():
        return None
    lo, hi = (
        float(min(d["measured"].min(), d["predicted"].min())),
        float(max(d["measured"].max(), d["predicted"].max())),
    )
    diag = pl.DataFrame({"x_lo": [lo, hi], "y_lo": [lo, hi]})
    x = alt.X("measured:Q", title="measured (ms)", scale=alt.Scale(type="log"))
    y = alt.Y("predicted:Q", title="modelled (ms)", scale=alt.Scale(type="log"))

    def pts(base: alt.Chart) -> alt.Chart:
        return base.mark_point(filled=True, size=50, tooltip=TOOLTIP_ALL).encode(
            x=x, y=y, color=alt.Color("series:N", title=None), shape=alt.Shape("pass:N", title=None)
        )

    def line(base: alt.Chart) -> alt.Chart:
        return base.mark_line(color="#999", strokeDash=[4, 3]).encode(
            x=alt.X("x_lo:Q", scale=alt.Scale(type="log")), y=alt.Y("y_lo:Q", scale=alt.Scale(type="log"))
        )

    chart, values = _layered_facet([("model", d, pts), ("diagonal", diag, line)], row=None, column=None)
    return ChartSpec(
        id="cp-model-validation",
        title="The CP model against measured times",
        chart=chart,
        values=values,
        data=d,
        caption="Each measured CP iteration (2 x H200) and each rank's local work timed on one GPU against "
        "the model's prediction for it; the dashed diagonal is a perfect prediction.",
        query="longca model validate: checks measured and rank_local",
    )

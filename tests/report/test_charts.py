from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from altair.utils.schemapi import validate_jsonschema
from altair.vegalite.v6.schema import load_schema
from report_rows import synthetic_table

from longca.report import charts, peers, queries
from longca.vocab import Time


@pytest.fixture(scope="module")
def cells() -> pl.DataFrame:
    return queries.cells(pl.from_arrow(synthetic_table()))


def _all_charts(c: pl.DataFrame) -> list[charts.ChartSpec]:
    peer = peers.load()
    out = []
    best = queries.best_kernel(c)
    out += [
        charts.support_chart(queries.support_matrix(c)),
        charts.choose_chart(queries.choose(c), c.get_column("kernel").unique().to_list()),
        charts.fraction_chart(queries.fraction_of_full(best)),
    ]
    ok = queries.mask_cells(c)
    out += [charts.mask_metric("causal", ok, m, peers.for_masks(peer)) for m in ("tflops", "peak_mem_gib")]
    sp = queries.sparse_cells(c)
    out += [charts.sparse_chart(sp, peers.for_sparse(peer), x) for x in ("density", "block_size", "seqlen_q")]
    out += [
        charts.cp_chart(queries.cp_cells(c), peers.for_cp(peer), k) for k in ("world", "length", "comm", "imbalance")
    ]
    out += [charts.linear_chart(*queries.linear_vs_softmax(c))]
    out += [charts.shape_chart(queries.shape_study(c))]
    return [ch for ch in out if ch is not None]


def test_every_chart_is_valid_vega_lite(cells: pl.DataFrame) -> None:
    specs = _all_charts(cells)
    assert len(specs) == 14
    schema = load_schema()
    for ch in specs:
        spec = ch.spec()
        assert validate_jsonschema(spec, schema, raise_error=False) is None, ch.id
        assert spec["datasets"][charts.DATASET], ch.id


def _layer(spec: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [v for v in spec["datasets"][charts.DATASET] if v.get("_layer") == name]


def test_mask_chart_draws_only_ok_cells_and_tags_peers(cells: pl.DataFrame) -> None:
    ok = queries.mask_cells(cells)
    ch = charts.mask_metric("full", ok, "tflops", peers.for_masks(peers.load()))
    spec = ch.spec()
    measured = _layer(spec, "measured")
    expected = ok.filter(pl.col("mask") == "full")
    assert len(measured) == expected.height
    assert {v["kernel"] for v in measured} == set(expected.get_column("kernel"))
    assert not any("source" in v for v in measured)  # no peer field leaks into measured rows
    published = _layer(spec, "peer_point") + _layer(spec, "peer_range")
    assert published and all(v["label"].endswith("(published)") for v in published)
    assert {v["mask"] for v in published} == {"full"}
    assert "FA3 648 · H100 SXM5 (published)" in {v["label"] for v in published}
    # panels are shapes: a figure joins only panels of its attention type, head dim and dtype
    assert all(v["shape"].startswith(v["attn"]) for v in published)


def test_peers_only_in_panels_that_have_measured_rows(cells: pl.DataFrame) -> None:
    ok = queries.mask_cells(cells).filter(pl.col("attn") == "GQA")
    spec = charts.mask_metric("full", ok, "tflops", peers.for_masks(peers.load())).spec()
    assert {v["attn"] for v in _layer(spec, "peer_point") + _layer(spec, "peer_range")} == {"GQA"}


def test_no_rows_no_chart() -> None:
    empty = queries.cells(pl.from_arrow(synthetic_table()).clear())
    assert charts.choose_chart(queries.choose(empty), []) is None
    assert charts.linear_chart(*queries.linear_vs_softmax(empty)) is None


def test_facet_cells_keep_their_columns_when_a_row_lacks_one() -> None:
    # fp8 rows are forward-only: without a placeholder, Vega slides the next row's first cell under "bwd"
    values = [
        {"shape": "bf16", "pass": "fwd", "_layer": "measured"},
        {"shape": "bf16", "pass": "bwd", "_layer": "measured"},
        {"shape": "fp8", "pass": "fwd", "_layer": "measured"},
    ]
    padded = charts.pad_facets(values, "shape", "pass")
    assert padded[:3] == values and padded[3:] == [{"shape": "fp8", "pass": "bwd", "_layer": "pad"}]
    assert charts.pad_facets(values, "shape", None) == values


def test_mask_chart_has_a_panel_per_shape_and_the_report_wide_kernel_colours(cells: pl.DataFrame) -> None:
    ok = queries.mask_cells(cells)
    kernels = sorted(cells.get_column("kernel").unique())
    spec = charts.mask_metric("causal", ok, "tflops", peers.for_masks(peers.load()).clear(), kernels).spec()
    assert spec["facet"]["row"]["field"] == "shape"
    shapes = set(ok.filter(pl.col("mask") == "causal").get_column("shape"))
    assert set(spec["facet"]["row"]["sort"]) == shapes
    color = next(e["color"] for e in _encodings(spec) if "color" in e)
    assert color["scale"]["domain"] == kernels and color["legend"]["symbolLimit"] == 0  # no "…N entries"
    # every (shape, pass) pair has a cell
    pairs = {(v["shape"], v["pass"]) for v in spec["datasets"][charts.DATASET]}
    assert pairs == {(s, p) for s in shapes for p in set(ok.get_column("pass"))}


def test_choose_chart_names_best_runner_up_and_margin(cells: pl.DataFrame) -> None:
    best = queries.choose(cells)
    ok = queries.mask_cells(cells)
    row = best.filter((pl.col("kernels") > 1) & ~pl.col("mask").is_in(queries.SPARSE_MASKS)).row(0, named=True)
    group = ok.filter(
        (pl.col("mask") == row["mask"])
        & (pl.col("seqlen_q") == row["seqlen_q"])
        & (pl.col("heads_q") == row["heads_q"])
        & (pl.col("heads_kv") == row["heads_kv"])
        & (pl.col("head_dim") == row["head_dim"])
        & (pl.col("dtype") == row["dtype"])
        & (pl.col("pass") == row["pass"])
    ).sort("tflops", descending=True)
    assert row["kernel"] == group.get_column("kernel")[0] and row["runner_up"] == group.get_column("kernel")[1]
    assert row["margin"] == pytest.approx(group.get_column("tflops")[0] / group.get_column("tflops")[1] - 1)
    assert row["kernels"] == group.height
    spec = charts.choose_chart(best, sorted(cells.get_column("kernel").unique())).spec()
    params = {p["name"]: p for p in spec["params"]}
    # one time only (no replays): no time buttons
    assert set(params) == {"heads", "head_dim", "dtype", "pass_"} and params["pass_"]["value"] == charts.CHOOSE_ALL
    assert {v["page"] for v in spec["datasets"][charts.DATASET]} <= {
        f"mask-{m}.html" for m in cells.get_column("mask").unique()
    } | {"sparse.html"}


def test_choose_ranks_at_kernel_time_first_and_eager_time_one_click_away(cells: pl.DataFrame) -> None:
    # one kernel replayed (its kernel time twice its eager throughput), the others never captured
    fast = queries.choose(cells).drop_nulls("runner_up").get_column("runner_up")[0]
    replayed = pl.col("kernel") == fast
    c = cells.with_columns(
        timing=pl.when(replayed).then(pl.lit("graph replay")).otherwise(pl.col("timing")),
        kernel_timed=replayed,
        **{
            k: pl.when(replayed).then(pl.col(k) * 2).otherwise(pl.col(k))
            for k in ("tflops_kernel", "tflops_kernel_ci_low", "tflops_kernel_ci_high")
        },
    )
    best = pl.concat([queries.choose(queries.at_time(c, t)) for t in Time], how="diagonal_relaxed")
    spec = charts.choose_chart(best, sorted(cells.get_column("kernel").unique())).spec()
    validate_jsonschema(spec, load_schema())
    params = {p["name"]: p for p in spec["params"]}
    assert params["time"]["value"] == "kernel" and params["time"]["bind"]["options"] == ["kernel", "eager"]
    assert "datum.time == time" in str(spec["transform"])
    values = spec["datasets"][charts.DATASET]
    assert {v["time"] for v in values} == {"kernel", "eager"}
    # kernel time: "*" where a kernel without kernel time was faster at eager time; eager time: never
    marked = [v for v in values if v["label"].split("\n")[0].endswith(" *")]
    assert marked and all(v["time"] == "kernel" and v["eager_only_faster"] > 0 for v in marked)
    assert len(marked) == sum(v.get("eager_only_faster", 0) > 0 for v in values)
    wins = {t: sum(v["kernel"] == fast for v in values if v["time"] == t) for t in ("kernel", "eager")}
    assert wins["kernel"] > wins["eager"]
    assert "at kernel time by default" in charts.choose_chart(best, []).caption


def test_choose_gives_the_share_of_a_measured_ceiling(cells: pl.DataFrame) -> None:
    device, dtype = cells.get_column("device_name")[0], cells.get_column("dtype")[0]
    ceiling = pl.DataFrame({"device_name": [device], "dtype": [dtype], "matmul_tflops": [500.0]})
    best = queries.choose(cells, ceiling).filter(pl.col("dtype") == dtype)
    assert best.height
    assert best.get_column("pct_matmul").to_list() == pytest.approx((best.get_column("tflops") / 500.0).to_list())


def test_records_are_json_safe() -> None:
    df = pl.DataFrame({"tflops": [float("nan"), float("inf"), 1.0], "kernel": ["a", "b", "c"]})
    assert [r["tflops"] for r in charts.records(df)] == [None, None, 1.0]


def test_slug_keeps_file_names_safe() -> None:
    assert charts.slug("../etc/<x> y") == "etc--x--y"
    assert charts.slug("causal_document") == "causal_document"


def test_variable_blocks_get_their_own_named_panel(cells: pl.DataFrame) -> None:
    # Real variable-block rows carry no block size (the H200 sweep's do): never a "block null" panel.
    sp = queries.sparse_cells(cells)
    sp = sp.with_columns(
        block_size=pl.when(pl.col("mask") == "variable_block_sparse")
        .then(pl.lit(None, sp.schema["block_size"]))
        .otherwise(pl.col("block_size"))
    )
    spec = charts.sparse_chart(sp, peers.for_sparse(peers.load()), "density").spec()
    labels = {v.get("block_label") for v in _layer(spec, "measured")}
    assert "variable blocks" in labels and all(label and "null" not in label for label in labels)


def test_sparse_length_chart_has_a_line_per_density_and_no_published_boxes(cells: pl.DataFrame) -> None:
    # Published sparse figures are at one length each: over a length axis they would be misplaced.
    sp = queries.sparse_cells(cells)
    spec = charts.sparse_chart(sp, peers.for_sparse(peers.load()), "seqlen_q").spec()
    measured = _layer(spec, "measured")
    assert len(measured) == sp.height and not _layer(spec, "peer_range") and not _layer(spec, "peer_point")
    assert {v["density_label"] for v in measured} == {f"density {round(d, 2)}" for d in sp.get_column("density")}
    assert "strokeDash" in str(spec) and "density_label" in str(spec)


@pytest.mark.parametrize("x", ["density", "block_size", "seqlen_q"])
def test_sparse_charts_draw_kernel_time_first_with_eager_time_one_click_away(cells: pl.DataFrame, x: str) -> None:
    spec = charts.sparse_chart(queries.sparse_cells(cells), peers.for_sparse(peers.load()), x).spec()
    validate_jsonschema(spec, load_schema())
    params = {p["name"]: p for p in spec["params"]}
    assert params["time"]["value"] == "kernel"
    assert f"{charts.SHOWN}" in str(spec) and "datum.tflops_kernel" in str(spec)
    assert all("tflops_kernel" in v for v in _layer(spec, "measured"))


def test_length_ticks_are_the_measured_lengths(cells: pl.DataFrame) -> None:
    ch = charts.cp_chart(queries.cp_cells(cells), peers.for_cp(peers.load()), "length")
    text = str(ch.spec())
    want = sorted({int(v) for v in queries.cp_cells(cells).get_column("seqlen_q")})
    assert f"'values': {want}" in text


@pytest.mark.parametrize("x", ["density", "block_size"])
def test_sparse_peer_layers_do_not_depend_on_input_order(cells: pl.DataFrame, x: str) -> None:
    # A rebuild from the same rows must write the same files (no churn in the committed report)
    sp, pe = queries.sparse_cells(cells), peers.for_sparse(peers.load())
    first = charts.sparse_chart(sp, pe, x).spec()
    for seed in (1, 2, 3):
        again = charts.sparse_chart(
            sp.sample(fraction=1.0, shuffle=True, seed=seed), pe.sample(fraction=1.0, shuffle=True, seed=seed), x
        ).spec()
        assert [_layer(again, k) for k in ("peer_range", "peer_point")] == [
            _layer(first, k) for k in ("peer_range", "peer_point")
        ]
    assert _layer(first, "peer_range")  # the comparison is not vacuous


def _encodings(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every `encoding` in a spec, however deep (layers, facets)."""
    found = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("encoding"), dict):
                found.append(node["encoding"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk({k: v for k, v in spec.items() if k != "datasets"})
    return found


def test_the_head_dim_chart_marks_dtype_by_point_shape_with_one_legend(cells: pl.DataFrame) -> None:
    # a dtype measured at one head dim only (fp16 at D=128) is a lone point: no line to dash
    enc = [e for e in _encodings(charts.shape_chart(queries.shape_study(cells)).spec()) if "shape" in e]
    assert enc and all(e["shape"]["field"] == "dtype" and e["strokeDash"]["legend"] is None for e in enc)
    cp = charts.cp_chart(queries.cp_cells(cells), peers.for_cp(peers.load()), "length").spec()
    assert not any("shape" in e for e in _encodings(cp))  # other dashed charts keep their dash legend


def test_the_head_dim_chart_orders_lengths_by_number(cells: pl.DataFrame) -> None:
    study = queries.shape_study(cells)
    s = study.get_column("seqlen_q").max()
    both = pl.concat([study, study.with_columns(pl.col("seqlen_q") * 4)])  # e.g. 4K and 16K: "16K" < "4K" as text
    order = charts.shape_chart(both).spec()["facet"]["row"]["sort"]
    short = f"S={s // 1024}K" if s >= 1024 else f"S={s}"
    long = f"S={4 * s // 1024}K"
    for mask in study.get_column("mask").unique():
        rows = [g for g in order if g.startswith(f"{mask} ")]
        assert [g.rsplit(" · ", 1)[1] for g in rows][:2] == [short, long], rows


def test_mask_chart_draws_the_spread_over_mask_draws_as_a_band() -> None:
    rows = [
        dict(
            kernel="k",
            mask="causal_document",
            seqlen_q=s,
            seqlen_k=s,
            batch=1,
            heads_q=8,
            heads_kv=8,
            head_dim=64,
            dtype="bfloat16",
            status="ok",
            tflops=t,
            median_ms=1.0,
            device_name="d",
            host="h",
            device="cuda",
            cell_id=f"k/{s}",
            world_size=1,
            mask_sample=i,
            **{"pass": "fwd"},
        )
        for s in (1024, 2048)
        for i, t in enumerate((90.0, 100.0, 130.0))
    ]
    from longca.store.schema import to_table

    c = queries.mask_cells(queries.cells(pl.from_arrow(to_table(rows))))
    ch = charts.mask_metric("causal_document", c, "tflops", pl.DataFrame())
    spec = ch.spec()
    band = _layer(spec, "draws")
    assert [(v["tflops_draw_low"], v["tflops"], v["tflops_draw_high"]) for v in band] == [(90.0, 100.0, 130.0)] * 2
    assert "the lowest to the highest draw" in ch.caption
    assert validate_jsonschema(spec, load_schema(), raise_error=False) is None
    # one draw per cell: no band
    one = queries.mask_cells(queries.cells(pl.from_arrow(to_table([r for r in rows if r["mask_sample"] == 0]))))
    assert _layer(charts.mask_metric("causal_document", one, "tflops", pl.DataFrame()).spec(), "draws") == []


def _find(spec, key: str) -> list:
    """Every value under `key` anywhere in a Vega-Lite spec."""
    found = []
    if isinstance(spec, dict):
        for k, v in spec.items():
            if k == key:
                found.append(v)
            found += _find(v, key)
    elif isinstance(spec, list):
        for v in spec:
            found += _find(v, key)
    return found


def test_throughput_is_drawn_at_kernel_time_with_eager_one_click_away() -> None:
    from longca.store.schema import to_table

    def row(kernel: str, s: int, graph: float | None) -> dict:
        return dict(
            kernel=kernel, mask="causal", seqlen_q=s, seqlen_k=s, batch=1, heads_q=8, heads_kv=8, head_dim=64,
            dtype="bfloat16", status="ok", tflops=100.0, median_ms=2.0, graph_median_ms=graph,
            device_name="d", host="h", device="cuda", cell_id=f"{kernel}/{s}", world_size=1, mask_sample=0,
            **{"pass": "fwd"},
        )  # fmt: skip

    rows = [row("captured", s, 1.6) for s in (1024, 2048)] + [row("eager_only", s, None) for s in (1024, 2048)]
    c = queries.mask_cells(queries.cells(pl.from_arrow(to_table(rows))))
    by_kernel = {r["kernel"]: r for r in c.to_dicts()}
    # 2.0 ms eager, 1.6 ms replayed: the launch time left out gives 25% more TFLOP/s
    assert by_kernel["captured"]["tflops_kernel"] == pytest.approx(125.0)
    assert by_kernel["captured"]["timing"] == "graph replay"
    assert (by_kernel["eager_only"]["tflops_kernel"], by_kernel["eager_only"]["timing"]) == (100.0, "eager")
    ch = charts.mask_metric("causal", c, "tflops", pl.DataFrame())
    spec = ch.spec()
    (param,) = [p for p in spec["params"] if p["name"] == "time"]
    assert param["value"] == "kernel" and param["bind"]["options"] == ["kernel", "eager"]
    assert {y["field"] for y in _find(spec, "y") if isinstance(y, dict) and "field" in y} == {"tflops_shown"}
    calc = {t["as"]: t["calculate"] for ts in _find(spec, "transform") for t in ts if "calculate" in t}
    assert calc["tflops_shown"] == "time == 'kernel' ? datum.tflops_kernel : datum.tflops"
    assert "kernel time by default" in ch.caption
    assert validate_jsonschema(spec, load_schema(), raise_error=False) is None
    # memory charts have nothing to switch
    memory = charts.mask_metric("causal", c.with_columns(peak_mem_gib=pl.lit(1.0)), "peak_mem_gib", pl.DataFrame())
    assert all(p["name"] != "time" for p in memory.spec().get("params", []))


def test_the_ceiling_is_taken_at_the_best_kernels_own_clock(cells: pl.DataFrame) -> None:
    device, dtype = cells.get_column("device_name")[0], cells.get_column("dtype")[0]
    clocked = cells.with_columns(clock_window_mhz=pl.lit(1500.0))
    ceiling = pl.DataFrame(
        {"device_name": [device], "dtype": [dtype], "matmul_tflops": [500.0], "matmul_tflops_per_ghz": [400.0]}
    )
    best = queries.choose(clocked, ceiling).filter(pl.col("dtype") == dtype)
    assert best.height and (best.get_column("ceiling_tflops") == 600.0).all()  # 400 per GHz at 1.5 GHz
    assert best.get_column("pct_matmul").to_list() == pytest.approx((best.get_column("tflops") / 600.0).to_list())
    unclocked = queries.choose(cells.with_columns(clock_window_mhz=pl.lit(None, pl.Float64)), ceiling)
    assert (unclocked.filter(pl.col("dtype") == dtype).get_column("ceiling_tflops") == 500.0).all()

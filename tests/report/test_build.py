from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest
from report_rows import ok_row

from longca.cli import main
from longca.vocab import Time


def test_site_layout(site: Path) -> None:
    built = json.loads((site / "build.json").read_text())
    for page in (
        "index.html",
        "overview.html",
        "masks.html",
        "sparse.html",
        "cp.html",
        "linear.html",
        "shapes.html",
        "gallery.html",
        "status.html",
        "peers.html",
        "environment.html",
        "mask-full.html",
        "mask-causal_document.html",
    ):
        assert (site / page).is_file(), page
    bundle = (site / "assets" / "vega-bundle.js").read_text()
    assert "window.vegaEmbed" in bundle and len(bundle) > 100_000
    assert built["charts"]
    for chart in built["charts"]:
        for ext in ("svg", "png", "vl.json", "csv"):
            assert (site / "charts" / f"{chart}.{ext}").stat().st_size > 0, (chart, ext)
        assert (site / "charts" / f"{chart}.svg").read_text().lstrip().startswith("<svg")
        assert (site / "charts" / f"{chart}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_chart_is_on_a_page_and_pages_link_the_bundle_relatively(site: Path) -> None:
    charts = set(json.loads((site / "build.json").read_text())["charts"])
    shown = set()
    for page in site.glob("*.html"):
        html = page.read_text()
        shown |= {c for c in charts if f'id="chart-{c}"' in html}
        if 'class="chart"' in html:
            assert '<script src="assets/vega-bundle.js"></script>' in html
    assert shown == charts


def test_downloads_hold_every_row(site: Path, rows_path: Path) -> None:
    rows = pq.read_table(rows_path)
    assert pq.read_table(site / "data" / "all.parquet").num_rows == rows.num_rows
    assert (
        pq.read_table(site / "data" / "all.parquet").column("samples_ms").to_pylist()
        == rows.column("samples_ms").to_pylist()
    )
    assert "COPY (SELECT * EXCLUDE (samples_ms) FROM" in (site / "environment.html").read_text()  # CSV on demand


def test_pages_carry_no_rows_and_data_js_holds_every_chart(site: Path) -> None:
    """Every chart's rows are in assets/data.js, once; the pages' specs name the dataset only."""
    import re

    charts = json.loads((site / "build.json").read_text())["charts"]
    text = (site / "assets" / "data.js").read_text()
    assert text.startswith("window.LONGCA_DATA = ")
    data = json.loads(text.removeprefix("window.LONGCA_DATA = ").rstrip().rstrip(";"))
    assert sorted(data) == sorted(charts)
    for page in site.glob("*.html"):
        html = page.read_text()
        for cid, body in re.findall(r'<script type="application/json" id="spec-([^"]+)">(.*?)</script>', html, re.S):
            spec = json.loads(body)
            assert "datasets" not in spec and spec["data"] == {"name": "rows"}, (page.name, cid)
    # the page's rows are exactly the exported spec's
    for cid in charts[:5]:
        exported = json.loads((site / "charts" / f"{cid}.vl.json").read_text())["datasets"]["rows"]
        assert decode(data[cid]) == exported, cid


def decode(enc: dict) -> list[dict]:
    """What the embed script's decode does (longca.report.assets.EMBED_JS), in Python."""
    rows = [{} for _ in range(enc["n"])]
    for name, col in enc["c"].items():
        values = col if isinstance(col, list) else [col["d"][i] for i in col["i"]]
        for row, v in zip(rows, values):
            if v is not None:
                row[name] = v
    return rows


def test_rows_encode_losslessly_and_repeated_columns_as_dictionaries() -> None:
    from longca.report.assets import encode_rows

    rows = [
        {"kernel": "fa4", "tflops": 1.5, "cell_id": "@a"},
        {"kernel": "fa4", "tflops": 2.5},
        {"kernel": "fa4", "tflops": None, "cell_id": "@c", "note": "x<y"},
        {"kernel": "flex", "tflops": 3.5},
    ]
    enc = encode_rows(rows)
    assert enc["c"]["kernel"] == {"d": ["fa4", "flex"], "i": [0, 0, 0, 1]}  # 2 distinct of 4: a dictionary
    assert enc["c"]["tflops"] == [1.5, 2.5, None, 3.5]
    assert decode(enc) == [{k: v for k, v in r.items() if v is not None} for r in rows]


def test_published_mode_writes_no_chart_files_and_links_none(tmp_path: Path, rows_path: Path) -> None:
    from longca.report import build_report

    built = build_report([rows_path], tmp_path / "site", static_exports=False)
    assert not (tmp_path / "site" / "charts").exists()
    for page in built.pages:
        assert "charts/" not in page.read_text(), page.name  # no link to a file that is not there
    assert (tmp_path / "site" / "assets" / "data.js").stat().st_size > 0


def test_the_first_page_chooses_a_kernel_for_a_shape(site: Path) -> None:
    html = (site / "index.html").read_text()
    assert "Which kernel for my shape?" in html and 'id="chart-choose"' in html
    nav = html.split("<main>")[0]
    assert nav.index('href="index.html"') < nav.index('href="overview.html"')  # the first page in the nav
    # --reruns: every cell measured once more, 2% slower: the note gives the move between runs
    assert "median moved by 2.0% (median) and at most 2.0% in 95% of" in html
    assert "re-run interval (tflops_rerun_low, tflops_rerun_high)" in html


def test_every_drawn_cell_carries_its_rerun_interval_beside_its_own(
    site: Path, rows_path: Path, reruns_path: Path
) -> None:
    # the interval a re-run on another lease should land in: the cell's own 95% interval widened to
    # the 95th percentile of the moves between runs (here 2% at every time scale), as TFLOP/s
    from longca.report import leases

    rows, earlier = pl.read_parquet(rows_path), pl.read_parquet(reruns_path)
    eager_p95 = leases.between_runs(rows, earlier).p95
    replay_p95 = leases.between_runs(rows, earlier, time=Time.KERNEL).p95  # the fixture's replays: 0
    text = (site / "assets" / "data.js").read_text()
    data = json.loads(text[text.index("=") + 1 :].strip().rstrip(";"))
    points = [p for p in decode(data["choose"]) if "tflops_ci_low" in p]
    # at kernel time a replayed cell takes the replays' move, every other cell the eager calls'
    replayed = [p for p in points if p["time"] == "kernel" and p["timing"] == "graph replay"]
    assert replayed and len(replayed) < len(points) and replay_p95 == 0
    for p in points:
        p95 = replay_p95 if p in replayed else eager_p95
        assert p["tflops_rerun_low"] == pytest.approx(min(p["tflops_ci_low"], p["tflops"] / (1 + p95)), rel=1e-4)
        assert p["tflops_rerun_high"] == pytest.approx(max(p["tflops_ci_high"], p["tflops"] * (1 + p95)), rel=1e-4)


def test_overview_content(site: Path) -> None:
    html = (site / "overview.html").read_text()
    for text in (
        "Kernel × mask support",
        "Choose page",
        "fraction of the best full-mask",
        "OOM at some sizes",
        "Fixture GPU (synthetic) @ fixture-host",
    ):
        assert text in html, text


def test_shape_study_has_its_page_and_leaves_the_length_charts(site: Path) -> None:
    html = (site / "shapes.html").read_text()
    assert 'id="chart-shapes-head-dim"' in html
    for text in ("D=64 bf16", "D=128 bf16", "D=128 fp16", "D=256 bf16"):  # the table's variant columns
        assert f"<th>{text}</th>" in html or f">{text}</th>" in html, text
    # the fixture's study (one length, 3 kernels x 2 passes x 3 variants per mask; one FA backward at
    # D=256 unsupported) is pointed to from the mask page, not drawn there
    assert "17 ok cells on this mask at another head dim or dtype" in (site / "mask-full.html").read_text()
    spec = json.loads((site / "charts" / "mask-full-throughput.vl.json").read_text())
    assert {v["head_dim"] for v in spec["datasets"]["rows"] if v.get("_layer") == "measured"} == {128}


def test_environment_page_names_the_machine_and_reproduce_command(site: Path) -> None:
    html = (site / "environment.html").read_text()
    for text in (
        "Fixture GPU (synthetic)",
        "fixture-host",
        "env-fixture",
        "run-fixture",
        "0000000",
        "longca report --data",
        "snakemake --cores all reports/fixture/index.html",
        "data/all.parquet",
    ):
        assert text in html, text


def test_gallery_page_says_what_it_has(site: Path) -> None:
    html = (site / "gallery.html").read_text()
    assert "<img" in html or "No gallery images were built" in html


def test_command_reports_a_missing_input(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["report", "--data", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "r")]) == 2
    assert "no such result file" in capsys.readouterr().err


def test_gpu_peer_figures_are_not_drawn_over_cpu_rows() -> None:
    from report_rows import synthetic_table

    from longca.report import build, peers, queries

    rows = pl.from_arrow(synthetic_table()).with_columns(device=pl.lit("cpu"))
    pages = {p.file: p for p in build._mask_pages(queries.cells(rows), peers.for_masks(peers.load()))}
    full = pages["mask-full.html"]
    assert any(k == "p" and "not drawn over rows measured without a GPU" in b[0] for k, b in full.blocks)
    spec = full.charts()[0].spec()
    assert {v["_layer"] for v in spec["datasets"]["rows"]} == {"measured"}


def test_empty_and_sparse_inputs_still_build(tmp_path: Path) -> None:
    from longca.report import build_report
    from longca.store.schema import to_table

    for name, rows in {"empty": [], "bare": [{"kernel": "k", "status": "error", "reason": "boom"}]}.items():
        pq.write_table(to_table(rows), tmp_path / f"{name}.parquet")
        built = build_report([tmp_path / f"{name}.parquet"], tmp_path / name, png=False)
        assert (tmp_path / name / "index.html").is_file() and (tmp_path / name / "assets" / "vega-bundle.js").is_file()
        status = (tmp_path / name / "status.html").read_text()
        assert ("boom" in status) == (name == "bare")
        assert all(c == "overview-support" for c in built.charts)


def test_status_page_tables_phases_from_new_rows_beside_old_files(tmp_path: Path) -> None:
    from longca.report import build_report
    from longca.store.schema import to_table

    base = ok_row(samples_ms=[500.0], cell_wall_s=2.0)
    old = to_table([dict(base, sweep="old_sweep", cell_id="o", schema_version=1)])
    old = old.drop_columns(["check_s", "timer_wall_s", "warmup_s"])  # as schema 1 wrote it
    pq.write_table(old, tmp_path / "old.parquet")
    new = to_table([dict(base, sweep="new_sweep", cell_id="n", check_s=0.5, timer_wall_s=1.0, warmup_s=0.25)])
    pq.write_table(new, tmp_path / "new.parquet")
    build_report([tmp_path / "old.parquet", tmp_path / "new.parquet"], tmp_path / "site", png=False)
    status = (tmp_path / "site" / "status.html").read_text()
    measured, rest = status.split("Where the cell wall time goes")
    phases, intervals = rest.split("Timing intervals")
    assert "old_sweep" in intervals and "new_sweep" in intervals  # every ok row has a timing
    assert "old_sweep" in measured and "new_sweep" in measured  # timed share: every cell with a wall
    assert "new_sweep" in phases and "old_sweep" not in phases  # phases: only rows that record them
    assert "check_share" in phases and "rest_share" in phases


def test_probe_rows_join_the_timing_tables_only(tmp_path: Path) -> None:
    from longca.report import build_report
    from longca.store.schema import to_table

    base = ok_row(samples_ms=[500.0], cell_wall_s=2.0, check_s=0.5, timer_wall_s=1.0, warmup_s=0.25)
    pq.write_table(to_table([dict(base, spec="s", sweep="main_sweep", cell_id="m")]), tmp_path / "rows.parquet")
    # a probe may re-measure the committed sweep's own cell: its rows stay apart, named for their file
    pq.write_table(
        to_table([dict(base, spec="s", sweep="<probe>", cell_id="m", samples_ms=[1500.0])]), tmp_path / "probe.parquet"
    )
    built = build_report([tmp_path / "rows.parquet"], tmp_path / "site", png=False, probe=[tmp_path / "probe.parquet"])
    status = (tmp_path / "site" / "status.html").read_text()
    measured, phases = status.split("Where the cell wall time goes")
    assert "s (probe probe)" in measured and "main_sweep" in measured and "s (probe probe)" in phases
    assert "&lt;probe&gt;" in measured and "<probe>" not in status  # escaped like any row text
    assert "0.75" in measured and "0.25" in measured  # each its own share: 1.5 s and 0.5 s of a 2 s wall
    # never drawn: no chart holds a probe row, and the download of all rows has none
    csvs = "".join(p.read_text() for p in (tmp_path / "site" / "charts").glob("*.csv"))
    assert "main_sweep" in csvs and "probe" not in csvs
    assert pl.read_parquet(tmp_path / "site" / "data" / "all.parquet").get_column("sweep").to_list() == ["main_sweep"]
    assert pl.read_parquet(tmp_path / "site" / "data" / "probes.parquet").get_column("sweep").to_list() == ["<probe>"]
    env = (tmp_path / "site" / "environment.html").read_text()
    assert "--probe" in env and "data/probes.parquet" in env
    assert built.charts  # the main rows are drawn


def test_the_full_length_agreement_is_tabled_on_the_status_page(tmp_path: Path) -> None:
    from longca.report import build_report
    from longca.store.schema import to_table

    long_ = dict(sweep="long", seqlen_q=524288, seqlen_k=524288, agree_kernel="fa4", agree_rel_diff=0.0009)
    rows = [
        ok_row(cell_id="f", **long_, **{"pass": "fwd"}),
        ok_row(
            cell_id="b",
            **long_,
            agree_rel_diff_dq=0.0021,
            agree_rel_diff_dk=0.0017,
            agree_rel_diff_dv=0.0012,
            **{"pass": "bwd"},
        ),
        ok_row(cell_id="short", sweep="dense"),  # within the check length: no agreement
    ]
    pq.write_table(to_table(rows), tmp_path / "rows.parquet")
    build_report([tmp_path / "rows.parquet"], tmp_path / "site", png=False)
    status = (tmp_path / "site" / "status.html").read_text()
    section = status.split("Full-length agreement")[1].split("</table>")[0]
    assert section.count("<tr") == 3  # the header, the forward and the backward line of the long cell
    assert ">512K<" in section and ">fa4<" in section and "0.0021" in section and ">dense<" not in section


def test_superseded_rows_are_listed_and_timed_but_never_drawn(tmp_path: Path) -> None:
    from datetime import datetime

    from longca.report import build_report
    from longca.store.schema import to_table

    base = ok_row(sweep="dense", cell_wall_s=2.0)
    old = dict(
        base,
        cell_id="k/full@aaaa",
        cell_digest="aaaa",
        tflops=111.0,
        samples_ms=[500.0],
        timestamp=datetime(2026, 12, 1, tzinfo=UTC),
        clock_start_mhz=1981,
        clock_end_mhz=1979,
        throttle_reasons="0x0",
    )
    new = dict(
        base,
        cell_id="k/full@bbbb",
        cell_digest="bbbb",
        tflops=222.0,
        samples_ms=[1500.0],
        timestamp=datetime(2026, 12, 2, tzinfo=UTC),
        clock_start_mhz=1851,
        clock_end_mhz=1703,
        throttle_reasons="0x4",
    )
    pq.write_table(to_table([new, old]), tmp_path / "rows.parquet")
    build_report([tmp_path / "rows.parquet"], tmp_path / "site", png=False)
    status = (tmp_path / "site" / "status.html").read_text()
    assert "Superseded measurements" in status and "2026-12-01" in status
    assert "s (superseded)" in status and "0.75" in status and "0.25" in status  # each protocol's own share
    # each protocol's clocks, side by side
    clocks = status[status.index("GPU clocks") :]
    assert all(str(mhz) in clocks for mhz in (1981, 1979, 1851, 1703)) and "sw_power_cap" in clocks
    csvs = "".join(p.read_text() for p in (tmp_path / "site" / "charts").glob("*.csv"))
    assert "222" in csvs and "111" not in csvs  # only the latest measurement is drawn
    # the download keeps every row
    assert sorted(pl.read_parquet(tmp_path / "site" / "data" / "all.parquet").get_column("tflops").to_list()) == [
        111.0,
        222.0,
    ]


def test_cells_the_given_spec_no_longer_has_are_named_on_the_status_page(tmp_path: Path) -> None:
    from longca.report import build_report
    from longca.spec.cells import expand
    from longca.spec.load import load_spec
    from longca.store.schema import to_table

    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        "name: tiny\ndevice: cpu\nheads: ['2:2']\nhead_dims: [16]\ndtypes: [float32]\npasses: [fwd]\n"
        "sweeps:\n  - name: dense\n    kernels: [naive]\n    masks: [full]\n    seqlens: [128]\n"
    )
    (cell,) = expand(load_spec(spec))
    base = ok_row(
        spec="tiny",
        sweep="dense",
        kernel="naive",
        seqlen_q=128,
        seqlen_k=128,
        heads_q=2,
        heads_kv=2,
        head_dim=16,
        dtype="float32",
    )
    current = dict(base, cell_id=cell.id, cell_digest=cell.digest)
    pq.write_table(to_table([current]), tmp_path / "now.parquet")
    build_report([tmp_path / "now.parquet"], tmp_path / "site", spec=spec, png=False)
    assert "earlier version of the spec" not in (tmp_path / "site" / "status.html").read_text()

    # a row measured under an earlier version (another digest, another mask the spec dropped)
    earlier = dict(base, mask="causal", cell_id="naive/causal@0ld", cell_digest="0ld0ld")
    other_spec = dict(base, spec="other", cell_id="x@1", cell_digest="1")  # not this spec's: not counted
    pq.write_table(to_table([current, earlier, other_spec]), tmp_path / "mixed.parquet")
    build_report([tmp_path / "mixed.parquet"], tmp_path / "site2", spec=spec, png=False)
    status = (tmp_path / "site2" / "status.html").read_text()
    section = status.split("Cells from an earlier version of the spec")[1].split("</table>")[0]
    assert "tiny.yaml" in section and ">dense<" in section and ">1<" in section and "other" not in section
    overview = (tmp_path / "site2" / "overview.html").read_text()
    assert "1 cells of sweep dense come from an earlier version of" in overview
    assert "earlier version" not in (tmp_path / "site" / "overview.html").read_text()


def test_fraction_summary_names_the_kernel_that_loses_least() -> None:
    from longca.report.build import _fraction_summary

    frac = pl.DataFrame(
        {
            "mask": ["causal"] * 3,
            "pass": ["fwd"] * 3,
            "shape": ["GQA"] * 3,
            "machine": ["m"] * 3,
            "kernel": ["fa4", "flex", "fa4"],
            "seqlen_q": [1024, 2048, 4096],
            "fraction": [0.5, 0.7, 0.9],
        }
    )
    summary, cols, numeric = _fraction_summary(frac)
    row = summary.row(0, named=True)
    assert (row["min fraction"], row["median fraction"], row["max fraction"], row["lengths"]) == (0.5, 0.7, 0.9, 3)
    assert row["best kernel (lengths won)"] == "fa4 2, flex 1"
    assert set(numeric) <= set(cols)


def test_every_link_points_to_a_file_that_exists(site: Path) -> None:
    import re

    missing = []
    for page in site.glob("*.html"):
        for target in re.findall(r'(?:href|src)="([^"#]+)"', page.read_text()):
            if not target.startswith(("http:", "https:", "data:", "mailto:")) and not (site / target).exists():
                missing.append((page.name, target))
    assert missing == []


def test_committed_reports_link_only_to_files_they_hold() -> None:
    import re

    root = Path(__file__).resolve().parents[2] / "reports"
    sites = [d for d in root.iterdir() if (d / "build.json").is_file()] if root.is_dir() else []
    missing = [
        (site.name, page.name, target)
        for site in sites
        for page in site.glob("*.html")
        for target in re.findall(r'(?:href|src)="([^"#]+)"', page.read_text())
        if not target.startswith(("http:", "https:", "data:", "mailto:")) and not (site / target).exists()
    ]
    assert missing == []


def test_pages_beside_the_report_are_linked_only_when_they_exist(tmp_path: Path, rows_path: Path) -> None:
    import pytest

    from longca.report import build_report

    (tmp_path / "site" / "compare").mkdir(parents=True)
    (tmp_path / "site" / "compare" / "index.html").write_text("<html></html>")
    build_report([rows_path], tmp_path / "site", static_exports=False, links=[("compare/index.html", "A vs B")])
    html = (tmp_path / "site" / "environment.html").read_text()
    assert '<a href="compare/index.html">A vs B</a>' in html and "--link" in html
    with pytest.raises(FileNotFoundError, match="no such file"):
        build_report([rows_path], tmp_path / "site", static_exports=False, links=[("missing.html", "gone")])


def test_the_choose_page_ranks_replayed_cells_at_kernel_time_with_their_own_moves() -> None:
    from report_rows import synthetic_table

    from longca.report import build, leases, queries
    from longca.vocab import Time

    rows = pl.from_arrow(synthetic_table())
    first = rows.with_columns(graph_median_ms=pl.col("median_ms") * 0.5)
    again = first.with_columns(
        run_id=pl.lit("run-before"),
        median_ms=pl.col("median_ms") * 1.5,
        graph_median_ms=pl.col("graph_median_ms") * 1.01,
    )
    moves, replayed = leases.between_runs(first, again), leases.between_runs(first, again, time=Time.KERNEL)
    page = build._choose_page(queries.cells(first), None, [], moves, replayed)
    texts = " ".join(b[1][0] for b in page.blocks if b[0] == "p")
    assert "median moved by 50.0% (median)" in texts  # eager
    assert "widened by the moves of replayed pairs instead: one cell's median moved by 1.0% (median)" in texts
    chart = next(b[1] for b in page.blocks if b[0] == "chart")
    assert {v["time"] for v in chart.values} == {"kernel", "eager"}
    # without a replay (a CPU run) the page ranks at eager time only, and says so
    plain = build._choose_page(queries.cells(rows.with_columns(graph_median_ms=None)), None, [], moves, None)
    chart = next(b[1] for b in plain.blocks if b[0] == "chart")
    assert {v["time"] for v in chart.values} == {"eager"} and "at eager time," in chart.caption


def test_a_mask_pages_numbers_are_the_time_its_chart_draws_first(site: Path, rows_path: Path) -> None:
    # the fixture replays flex at 1K at 0.4 of its eager time: the table gives its kernel time
    from longca.report import queries

    html = (site / "mask-full.html").read_text()
    assert "The numbers drawn above, at kernel time as the chart first draws them" in html
    c = queries.mask_cells(queries.cells(pl.read_parquet(rows_path)))
    flex = c.filter(
        (pl.col("kernel") == "flex")
        & (pl.col("mask") == "full")
        & (pl.col("seqlen_q") == 1024)
        & (pl.col("pass") == "fwd")
    )
    assert flex.height == 2  # two head shapes
    for kernel_time, eager in flex.select("tflops_kernel", "tflops").rows():
        assert kernel_time == pytest.approx(eager / 0.4)
        assert f'class=" num">{round(kernel_time)}</td>' in html


def test_the_choose_page_answers_only_from_cells_of_the_specs_current_protocol(tmp_path: Path) -> None:
    """A faster row of an earlier protocol (another digest of the same cell) never wins a square:
    the page ranks the current cells and says how many earlier ones it left out."""
    import json
    from datetime import UTC, datetime

    from longca.report import build_report
    from longca.spec.cells import expand
    from longca.spec.load import load_spec
    from longca.store.schema import to_table

    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        "name: tiny\ndevice: cpu\nheads: ['2:2']\nhead_dims: [16]\ndtypes: [float32]\npasses: [fwd]\n"
        "sweeps:\n  - name: dense\n    kernels: [naive, sdpa_math]\n    masks: [full]\n    seqlens: [128]\n"
    )
    cells = {c.kernel: c for c in expand(load_spec(spec))}
    shape = dict(spec="tiny", sweep="dense", seqlen_q=128, seqlen_k=128, heads_q=2, heads_kv=2, head_dim=16)
    shape.update({"dtype": "float32", "mask_variant": "default", "pass": "fwd"})
    now = [
        dict(ok_row(**shape, kernel=k, median_ms=ms, tflops=6.0 / ms), cell_id=cells[k].id, cell_digest=cells[k].digest)
        for k, ms in (("naive", 2.0), ("sdpa_math", 3.0))
    ]
    # sdpa_math under an earlier protocol: ten times faster, its id's digest not the spec's
    old_id = cells["sdpa_math"].id.rsplit("@", 1)[0] + "@0ld0ld00"
    earlier = dict(now[1], median_ms=0.2, tflops=30.0, cell_id=old_id, cell_digest="0ld0ld000000", run_id="old-run")
    earlier["timestamp"] = datetime(2024, 1, 1, tzinfo=UTC)  # measured before the current rows
    pq.write_table(to_table([*now, earlier]), tmp_path / "rows.parquet")
    build_report([tmp_path / "rows.parquet"], tmp_path / "site", spec=spec, png=False, static_exports=False)
    text = (tmp_path / "site" / "assets" / "data.js").read_text()
    choose = decode(json.loads(text.removeprefix("window.LONGCA_DATA = ").rstrip().rstrip(";"))["choose"])
    assert [(r["kernel"], r.get("runner_up")) for r in choose] == [("naive", "sdpa_math")]
    page = (tmp_path / "site" / "index.html").read_text()
    assert (
        "only from cells measured under the current protocol of spec &#39;tiny&#39; (2 cells); 1 of its cells" in page
    )

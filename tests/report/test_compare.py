"""`longca compare`: A/B verdicts on constructed result sets (every verdict, the interval, the
environment diff, bad input) and on the published H200 set against itself."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from longca.cli import main
from longca.report.compare import compare, median_interval, ratio_interval
from longca.store.schema import to_table

ROOT = Path(__file__).resolve().parents[2]


def _row(kernel: str, mask: str, seqlen: int, samples: list[float], status: str = "ok", **extra) -> dict:
    row = dict(
        kernel=kernel,
        mask=mask,
        mask_params="{}",
        mask_sample=0,
        pass_="fwd",
        seqlen_q=seqlen,
        seqlen_k=seqlen,
        batch=1,
        heads_q=8,
        heads_kv=8,
        head_dim=64,
        head_dim_v=64,
        dtype="bfloat16",
        world_size=1,
        status=status,
        reason=None if status == "ok" else "why",
        samples_ms=samples,
        median_ms=float(sorted(samples)[len(samples) // 2]) if samples else None,
        p20_ms=None,
        p80_ms=None,
        tflops=1.0,
        mask_area=seqlen * seqlen,
        peak_mem_bytes=1,
        device_name="GPU A",
        torch="2.11.0",
        run_id="r1",
        cell_id=f"{kernel}/{mask}/{seqlen}@d{seqlen}",
        cell_digest=f"d{kernel}{mask}{seqlen}",
        spec="s",
        sweep="w",
    )
    row["pass"] = row.pop("pass_")
    row.update(extra)
    return row


def _base() -> list[dict]:
    tight = [1.000 + 0.001 * i for i in range(20)]  # +-1% spread: 20 samples
    return [
        _row(k, m, s, [x * s / 1024 for x in tight])
        for k in ("fa4", "flex")
        for m in ("full", "causal")
        for s in (1024, 4096)
    ] + [_row("naive", "full", 65536, [], status="oom")]


def _write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    path = tmp_path / f"{name}.parquet"
    pq.write_table(to_table(rows), path)
    return path


def test_the_median_interval_is_distribution_free_and_the_ratio_interval_brackets_the_ratio():
    med, lo, hi = median_interval([5.0, 1.0, 3.0])
    assert (med, lo, hi) == (3.0, 1.0, 5.0)  # n <= 5: the whole range
    xs = list(range(1, 101))
    med, lo, hi = median_interval(xs)
    assert lo < med < hi and 35 <= lo <= 45 and 56 <= hi <= 66
    r, lo, hi = ratio_interval(xs, [2 * x for x in xs])
    assert lo < r < hi and r == pytest.approx(2.0, rel=0.02)


def test_a_set_against_itself_is_all_same(tmp_path):
    base = _write(tmp_path, "base", _base())
    result = compare(base, base)
    assert {r["verdict"] for r in result.records} == {"same"} and result.summary["verdicts"] == {"same": 9}
    assert all(r["ratio"] in (None, 1.0) for r in result.records) and result.environment == []


def test_exactly_the_cell_made_10_percent_slower_is_slower_and_fails_the_gate(tmp_path, capsys):
    rows = _base()
    base = _write(tmp_path, "base", rows)
    slow = [dict(r, run_id="r2") for r in rows]  # a re-run: a new measurement of every cell
    slow[3] = dict(slow[3], samples_ms=[x * 1.10 for x in slow[3]["samples_ms"]])
    new = _write(tmp_path, "new", slow)
    out = tmp_path / "out.json"
    assert main(["compare", str(base), str(new), "--json", str(out), "--fail-on", "slower"]) == 1
    data = json.loads(out.read_text())
    by_verdict = {}
    for rec in data["rows"]:
        by_verdict.setdefault(rec["verdict"], []).append(rec)
    assert [(r["kernel"], r["mask"], r["seqlen_q"]) for r in by_verdict["slower"]] == [("fa4", "causal", 4096)]
    slow_rec = by_verdict["slower"][0]
    assert 1.05 < slow_rec["ratio_ci_low"] <= slow_rec["ratio"] <= slow_rec["ratio_ci_high"]
    assert slow_rec["ratio"] == pytest.approx(1.10, rel=1e-3)
    assert set(by_verdict) == {"slower", "same"}  # the other re-measured cells: the same samples
    assert data["summary"]["by_kernel"]["fa4"]["slower"] == 1 and "matched_on" in data["summary"]
    assert "failing: 1 slower" in capsys.readouterr().out
    assert main(["compare", str(base), str(new)]) == 0  # without the gate: a report, exit 0


def test_noise_status_changes_one_sided_cells_and_the_environment_diff(tmp_path):
    rows = _base()
    base = _write(tmp_path, "base", rows)
    changed = [dict(r, run_id="r2", torch="2.12.0") for r in rows[:-1]]
    changed[0] = dict(
        changed[0], samples_ms=[x * (1.0 + 0.05 * (i % 2)) for i, x in enumerate(changed[0]["samples_ms"])]
    )
    changed[1] = dict(changed[1], status="oom", samples_ms=[], reason="CUDA out of memory")
    changed[2] = dict(changed[2], samples_ms=[x * 0.8 for x in changed[2]["samples_ms"]])
    changed.append(_row("fa4", "causal", 16384, [9.0] * 5, torch="2.12.0"))  # a cell the base lacks
    new = _write(tmp_path, "new", changed)
    result = compare(base, new)
    verdicts = {(r["kernel"], r["mask"], r["seqlen_q"]): r["verdict"] for r in result.records}
    assert verdicts[("fa4", "full", 1024)] == "noisy"  # the interval straddles 1.03
    assert verdicts[("fa4", "full", 4096)] == "status changed"
    assert verdicts[("fa4", "causal", 1024)] == "faster"
    assert verdicts[("fa4", "causal", 16384)] == "only in new"
    assert verdicts[("naive", "full", 65536)] == "only in base"
    assert {"fact": "torch", "base": ["2.11.0"], "new": ["2.12.0"]} in result.environment
    page = Path(result and tmp_path) / "page"
    from longca.report.compare import write_html

    html = write_html(result, page).read_text()
    assert "2.12.0" in html and 'data-verdict="faster"' in html and '<select id="f-kernel">' in html


def test_the_terminal_summary_names_a_few_values_of_a_fact_and_counts_the_rest(tmp_path):
    """A published set spans dozens of commits: the summary names three, the JSON and page keep all."""
    from longca.report.compare import summary_text

    rows = _base()
    base = _write(tmp_path, "base", [dict(r, git_commit=f"c{i:02d}") for i, r in enumerate(rows)])
    new = _write(tmp_path, "new", [dict(r, git_commit="d00") for r in rows])
    result = compare(base, new)
    (commits,) = [e for e in result.environment if e["fact"] == "git_commit"]
    assert commits["base"] == [f"c{i:02d}" for i in range(len(rows))] and commits["new"] == ["d00"]
    assert (
        f"  environment: git_commit: base c00, c01, c02 (+{len(rows) - 3} more) | new d00"
        in summary_text(result).splitlines()
    )


def test_bad_input_is_named(tmp_path):
    base = _write(tmp_path, "base", _base())
    other = tmp_path / "other.parquet"
    pq.write_table(pq.read_table(base).select(["kernel", "mask"]), other)
    with pytest.raises(ValueError, match="not a longca result table"):
        compare(base, other)
    newer = tmp_path / "newer.parquet"
    pq.write_table(to_table([dict(r, schema_version=99) for r in _base()]), newer)
    with pytest.raises(ValueError, match="newer than this longca reads"):
        compare(base, newer)
    elsewhere = _write(tmp_path, "elsewhere", [_row("fa4", "full", 123, [1.0])])
    with pytest.raises(ValueError, match="nothing matched"):
        compare(base, elsewhere)
    with pytest.raises(ValueError, match="threshold"):
        compare(base, base, threshold=3)


def test_the_published_set_against_itself_is_all_same():
    published = ROOT / "results" / "h200" / "all.parquet"
    result = compare(published, published)
    assert result.summary["verdicts"] == {"same": len(result.records)} and len(result.records) > 5000
    assert not [r for r in result.records if r["ratio"] is not None and not math.isclose(r["ratio"], 1.0)]


def test_every_matched_cell_carries_the_command_that_measures_it_again(tmp_path):
    """The repro command selects exactly the row's cell of its spec (`longca run --only ...`)."""
    import shlex

    from longca.report.repro import repro_command
    from longca.run.rows import cell_columns
    from longca.spec.cells import expand
    from longca.spec.load import load_spec
    from longca.spec.select import selector

    cells = expand(load_spec(ROOT / "specs" / "default.yaml"))
    for cell in (cells[0], next(c for c in cells if c.cp_mechanism)):
        row = cell_columns(cell)
        args = shlex.split(repro_command(row))
        assert args[:6] == ["longca", "run", "--spec", "specs/default.yaml", "--sweep", cell.sweep]
        only = [args[i + 1] for i, a in enumerate(args) if a == "--only"]
        chosen = [c for c in cells if selector(only, [cell.sweep])(c)]
        assert cell in chosen and {(c.mask_variant, c.cp_variant) for c in chosen} >= {
            (cell.mask_variant, cell.cp_variant)
        }
        assert {c.partition[1:] == cell.partition[1:] for c in chosen} == {True}
        assert {c.mask_variant for c in chosen} == {cell.mask_variant}  # one mask variant: the row's
    base = _write(tmp_path, "base", _base())
    rec = compare(base, base).records[0]
    assert rec["repro"].startswith("longca run --spec specs/s.yaml --sweep w --only kernel=")


def test_a_published_cell_made_10_percent_slower_is_the_one_slower_cell(tmp_path):
    import pyarrow as pa
    import pyarrow.compute as pc

    published = pq.read_table(ROOT / "results" / "h200" / "all.parquet")
    # the victim: the ok row with most samples among those whose middle 60% lie within 1% of the
    # median, so a 10% shift is beyond its noise (a host-bound 1K row spreads wider than that)
    spread = pc.divide(pc.subtract(published["p80_ms"], published["p20_ms"]), published["median_ms"])
    ok = pc.and_(pc.equal(published["status"], "ok"), pc.less(spread, 0.01)).fill_null(False)
    counts = pc.list_value_length(published["samples_ms"]).fill_null(0)
    victim = int(pc.index(pc.if_else(ok, counts, 0), pc.max(pc.if_else(ok, counts, 0))).as_py())
    samples = published["samples_ms"].to_pylist()
    samples[victim] = [x * 1.10 for x in samples[victim]]
    copy = published.set_column(
        published.schema.get_field_index("samples_ms"),
        "samples_ms",
        pa.array(samples, type=published.schema.field("samples_ms").type),
    )
    pq.write_table(copy, tmp_path / "slower.parquet")
    out = tmp_path / "out.json"
    code = main(
        [
            "compare",
            str(ROOT / "results" / "h200" / "all.parquet"),
            str(tmp_path / "slower.parquet"),
            "--json",
            str(out),
            "--fail-on",
            "slower",
        ]
    )
    rows = json.loads(out.read_text())["rows"]
    slower = [r for r in rows if r["verdict"] == "slower"]
    assert code == 1 and len(slower) == 1 and slower[0]["cell_id"] == published["cell_id"][victim].as_py()
    assert {r["verdict"] for r in rows} == {"same", "slower"}


def test_a_rerun_counts_the_medians_inside_the_published_intervals(tmp_path, capsys):
    """The re-run check: how many new medians land inside the base rows' stored 95% intervals."""
    rows = [
        dict(r, ci_low_ms=r["median_ms"] * 0.99, ci_high_ms=r["median_ms"] * 1.01) if r["samples_ms"] else r
        for r in _base()
    ]
    base = _write(tmp_path, "base", rows)
    rerun = [dict(r, run_id="r2") for r in rows]
    for i in (0, 5):  # two cells 3% slower on the re-run: outside their +-1% intervals
        rerun[i] = dict(
            rerun[i], samples_ms=[x * 1.03 for x in rerun[i]["samples_ms"]], median_ms=rerun[i]["median_ms"] * 1.03
        )
    result = compare(base, _write(tmp_path, "new", rerun))
    assert (result.summary["inside_base_ci"], result.summary["with_base_ci"]) == (6, 8)  # the oom cell has none
    outside = sorted(
        (r["kernel"], r["mask"], r["seqlen_q"]) for r in result.records if r.get("inside_base_ci") is False
    )
    assert outside == sorted((rows[i]["kernel"], rows[i]["mask"], rows[i]["seqlen_q"]) for i in (0, 5))
    assert main(["compare", str(base), str(tmp_path / "new.parquet")]) == 0
    assert "new medians inside the base's 95% interval: 6 of 8 (75%)" in capsys.readouterr().out
    # a base without intervals (rows before schema 4) counts nothing
    plain = compare(
        _write(tmp_path, "plain", _base()), _write(tmp_path, "plain2", [dict(r, run_id="r2") for r in _base()])
    )
    assert plain.summary["with_base_ci"] == 0


def test_a_rerun_at_a_lower_clock_is_told_apart_from_a_kernel_change(tmp_path, capsys):
    """A whole set 3% slower at a 3% lower in-window SM clock: outside the +-1% intervals as measured,
    inside them at the base's clock, and the summary puts the time shift beside the clock shift."""
    rows = [
        dict(r, ci_low_ms=r["median_ms"] * 0.99, ci_high_ms=r["median_ms"] * 1.01, clock_window_mhz=1800)
        for r in _base()
        if r["samples_ms"]
    ]
    base = _write(tmp_path, "base", rows)
    slow = 1800 / 1746  # the clock ratio: 3.1% longer calls
    rerun = [
        dict(
            r,
            run_id="r2",
            clock_window_mhz=1746,
            samples_ms=[x * slow for x in r["samples_ms"]],
            median_ms=r["median_ms"] * slow,
        )
        for r in rows
    ]
    rerun[3] = dict(
        rerun[3], samples_ms=[x * 1.06 for x in rerun[3]["samples_ms"]], median_ms=rerun[3]["median_ms"] * 1.06
    )
    result = compare(base, _write(tmp_path, "new", rerun))
    s = result.summary
    assert (s["inside_base_ci"], s["with_base_ci"]) == (0, 8)
    assert (s["inside_base_ci_at_base_clock"], s["with_clocks"]) == (7, 8)  # the kernel that changed stays out
    assert s["median_clock_ratio"] == pytest.approx(slow) and s["median_ratio"] == pytest.approx(slow, rel=1e-6)
    assert [r["inside_base_ci_at_base_clock"] for r in result.records].count(False) == 1
    assert main(["compare", str(base), str(tmp_path / "new.parquet")]) == 0
    out = capsys.readouterr().out
    assert "median time ratio new/base 1.031; the in-window SM clocks alone predict 1.031" in out
    assert "at the base's clock 7 of 8 new medians are inside (88%)" in out


def test_a_rerun_is_judged_against_the_rerun_interval_measured_before_it(tmp_path, capsys):
    """Earlier runs of the base's cells give the move between runs (here at most 3.5%); a re-run 3%
    slower lands outside every +-1% interval but inside 7 of 8 re-run intervals (one cell 5% slower)."""
    rows = [
        dict(r, ci_low_ms=r["median_ms"] * 0.99, ci_high_ms=r["median_ms"] * 1.01) for r in _base() if r["samples_ms"]
    ]
    base = _write(tmp_path, "base", rows)
    earlier = [dict(r, run_id="r0", median_ms=r["median_ms"] * (1 + 0.005 * i)) for i, r in enumerate(rows)]
    reruns = _write(tmp_path, "reruns", earlier)
    new = [dict(r, run_id="r2", median_ms=r["median_ms"] * (1.05 if i == 2 else 1.03)) for i, r in enumerate(rows)]
    result = compare(base, _write(tmp_path, "new", new), reruns=[reruns])
    s = result.summary
    assert s["rerun_p95"] == pytest.approx(0.035) and s["rerun_pairs"] == 8
    assert (s["inside_base_ci"], s["inside_rerun_interval"], s["with_base_ci"]) == (0, 7, 8)
    outside = [r["cell_id"] for r in result.records if r.get("inside_rerun_interval") is False]
    assert outside == [rows[2]["cell_id"]]
    assert main(["compare", str(base), str(tmp_path / "new.parquet"), "--reruns", str(reruns)]) == 0
    assert s["rerun_scales"] == [dict(scale="1-10 ms", p95=pytest.approx(0.035), pairs=8, inside=7, of=8)]
    out = capsys.readouterr().out
    assert "re-run interval (its 95% interval widened to the move between runs of its time scale, " in out
    assert "95th percentile of 8 pairs): 7 of 8 (88%)\n" in out
    assert "  1-10 ms: widened by 3.5% (8 pairs: too few, the widest move): 7 of 8 (88%)" in out
    # earlier runs of other cells say nothing about these: an error naming the option, not a count
    strangers = _write(tmp_path, "strangers", [dict(r, cell_digest="other" + r["cell_digest"]) for r in earlier])
    with pytest.raises(ValueError, match="--reruns .*strangers.parquet: no cell of .* is there from another run"):
        compare(base, _write(tmp_path, "new", new), reruns=[strangers])
    with pytest.raises(ValueError, match="--reruns .*missing.parquet: no such file"):
        compare(base, base, reruns=[tmp_path / "missing.parquet"])

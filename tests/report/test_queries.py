from __future__ import annotations

from datetime import UTC
from typing import Any

import polars as pl
import pytest
from report_rows import synthetic_table

from longca.report import queries
from longca.store.schema import to_table
from longca.vocab import Time


def _row(
    kernel: str = "k", mask: str = "full", s: int = 1024, status: str = "ok", tflops: float | None = 100.0, **kw: Any
) -> dict[str, Any]:
    row = dict(
        kernel=kernel,
        mask=mask,
        seqlen_q=s,
        seqlen_k=s,
        batch=1,
        heads_q=8,
        heads_kv=8,
        head_dim=64,
        dtype="bf16",
        status=status,
        tflops=tflops if status == "ok" else None,
        device_name="dev",
        host="h",
        device="cuda",
        cell_id=f"{kernel}/{mask}/{s}/{kw.get('pass', 'fwd')}",
        world_size=1,
        median_ms=1.0,
        reason=None if status == "ok" else f"{status} reason",
    )
    row["pass"] = "fwd"
    row.update(kw)
    return row


def _cells(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return queries.cells(pl.from_arrow(to_table(rows)))


def test_cell_is_the_median_of_its_samples() -> None:
    c = _cells([_row(tflops=t, mask_sample=i) for i, t in enumerate((10.0, 30.0, 20.0))])
    assert c.height == 1
    assert c.item(0, "tflops") == 20.0 and c.item(0, "rows") == 3 and c.item(0, "status") == "ok"


def test_the_draw_spread_stays_apart_from_the_timing_interval() -> None:
    # three mask draws, each timed with its own interval (median 1 ms, 0.9-1.1)
    rows = [
        _row(tflops=t, mask_sample=i, median_ms=1.0, ci_low_ms=0.9, ci_high_ms=1.1, samples_ms=[1.0] * 9)
        for i, t in enumerate((90.0, 120.0, 100.0))
    ]
    c = _cells(rows)
    assert (c.item(0, "tflops_draw_low"), c.item(0, "tflops"), c.item(0, "tflops_draw_high")) == (90.0, 100.0, 120.0)
    # the timing interval is the draws' median interval, not widened by the draws' spread
    assert c.item(0, "tflops_ci_low") == pytest.approx(100.0 / 1.1)
    assert c.item(0, "tflops_ci_high") == pytest.approx(100.0 / 0.9)


def test_one_failed_sample_withholds_the_whole_cell() -> None:
    c = _cells([_row(mask_sample=0), _row(mask_sample=1, status="incorrect")])
    assert c.item(0, "status") == "incorrect" and not c.item(0, "all_ok")
    assert queries.mask_cells(c).is_empty()
    assert queries.partly_failed(c) == 1


@pytest.mark.parametrize("status", ["error", "incorrect", "oom", "unsupported", "timeout"])
def test_non_ok_never_drawn_and_always_listed(status: str) -> None:
    rows = [_row(kernel="good"), _row(kernel="bad", status=status)]
    df = pl.from_arrow(to_table(rows))
    c = queries.cells(df)
    for frame in (queries.mask_cells(c), queries.best_kernel(c), queries.sparse_cells(c), queries.cp_cells(c)):
        assert "bad" not in frame.get_column("kernel").to_list()
    bad = queries.non_ok(df, c)
    assert bad.get_column("kernel").to_list() == ["bad"]
    assert bad.get_column("reason").to_list() == [f"{status} reason"]


def test_same_cell_on_two_machines_stays_two_cells() -> None:
    c = _cells([_row(host="a", tflops=10.0), _row(host="b", tflops=30.0)])
    assert sorted(c.get_column("tflops").to_list()) == [10.0, 30.0]


def test_best_kernel_and_fraction_of_full() -> None:
    c = _cells(
        [
            _row("a", "full", tflops=200.0),
            _row("b", "full", tflops=150.0),
            _row("a", "causal", tflops=80.0),
            _row("b", "causal", tflops=120.0),
            _row("b", "sliding_window", s=2048, tflops=50.0),
        ]
    )
    best = queries.best_kernel(c)
    by = {r["mask"]: (r["kernel"], r["tflops"]) for r in best.iter_rows(named=True)}
    assert by == {"full": ("a", 200.0), "causal": ("b", 120.0), "sliding_window": ("b", 50.0)}
    frac = {r["mask"]: r["fraction"] for r in queries.fraction_of_full(best).iter_rows(named=True)}
    # no full-mask cell at 2048: no fraction rather than a made-up one
    assert frac == {"full": 1.0, "causal": 0.6}


def test_fraction_leaves_out_lengths_where_fewer_kernels_ran() -> None:
    # At 2048 only kernel b ran: its fraction there would compare another kernel set.
    c = _cells(
        [
            _row("a", "full", tflops=200.0),
            _row("b", "full", tflops=150.0),
            _row("a", "causal", tflops=80.0),
            _row("b", "causal", tflops=120.0),
            _row("b", "full", s=2048, tflops=150.0),
            _row("b", "causal", s=2048, tflops=15.0),
        ]
    )
    best = queries.best_kernel(c)
    assert set(queries.fraction_of_full(best).get_column("seqlen_q")) == {1024, 2048}
    kept = queries.fraction_of_full(best, c)
    assert set(kept.get_column("seqlen_q")) == {1024}


def test_fraction_keeps_lengths_where_only_losing_kernels_are_missing() -> None:
    # Kernel c (a slow baseline) ran only at 1024 and never wins: 2048 still counts.
    c = _cells(
        [
            _row("a", "full", tflops=200.0),
            _row("a", "causal", tflops=120.0),
            _row("c", "full", tflops=20.0),
            _row("c", "causal", tflops=10.0),
            _row("a", "full", s=2048, tflops=210.0),
            _row("a", "causal", s=2048, tflops=105.0),
        ]
    )
    kept = queries.fraction_of_full(queries.best_kernel(c), c)
    assert {(r["mask"], r["seqlen_q"]): r["fraction"] for r in kept.iter_rows(named=True)} == {
        ("causal", 1024): 0.6,
        ("causal", 2048): 0.5,
        ("full", 1024): 1.0,
        ("full", 2048): 1.0,
    }


def test_support_matrix_categories() -> None:
    rows = [
        _row("a", "full"),
        _row("a", "full", s=2048, status="oom"),
        _row("a", "causal", status="unsupported"),
        _row("b", "full"),
        _row("b", "causal", status="error"),
        _row("b", "causal", s=2048),
    ]
    m = {
        (r["kernel"], r["mask"]): (r["category"], r["label"])
        for r in queries.support_matrix(_cells(rows)).iter_rows(named=True)
    }
    assert m[("a", "full")] == ("OOM at some sizes", "1/2 ok")
    assert m[("a", "causal")] == ("unsupported", "0/1 ok")
    assert m[("b", "full")] == ("supported", "1/1 ok")
    assert m[("b", "causal")][0].startswith("failed")


def test_cp_ratios() -> None:
    c = _cells(
        [
            _row(
                world_size=2,
                cp_mechanism="ring",
                rank_ms=[1.0, 3.0],
                rank_area=[10, 30],
                comm_exposed_ms=0.5,
                median_ms=2.0,
            )
        ]
    )
    cp = queries.cp_cells(c)
    assert cp.item(0, "imbalance_time") == pytest.approx(1.5)
    assert cp.item(0, "imbalance_area") == pytest.approx(1.5)
    assert cp.item(0, "comm_share") == pytest.approx(0.25)
    assert queries.mask_cells(c).is_empty()  # CP rows are not single-device kernel results


def test_cp_vs_single_matches_the_per_rank_work() -> None:
    rows = [
        _row("cudnn", "causal", 32768, tflops=600.0, cell_id="s32"),
        _row("cudnn", "causal", 65536, tflops=500.0, cell_id="s64"),  # same total length: not the match
        _row("cudnn", "causal", 32768, tflops=600.0, heads_kv=2, cell_id="s32gqa"),  # other heads
        _row(
            "cudnn",
            "causal",
            65536,
            tflops=540.0,
            world_size=2,
            cp_mechanism="ring_p2p",
            cp_balance="zigzag",
            cell_id="cp",
        ),
        _row("cudnn", "causal", 262144, tflops=500.0, world_size=2, cp_mechanism="ulysses", cell_id="cp-no-single"),
    ]
    tiles = "triton tiles fwd=128,128,4,2"
    rows += [
        _row(
            "triton_block_sparse",
            "block_sparse",
            32768,
            tflops=400.0,
            mask_variant="b128",
            backend=tiles,
            cell_id="t32",
        ),
        _row(
            "triton_block_sparse",
            "block_sparse",
            32768,
            tflops=100.0,
            mask_variant="b64",
            backend=tiles,
            cell_id="t32-64",
        ),
        # a CP row that does not name its tiles has nothing to be compared with
        _row(
            "triton_block_sparse",
            "block_sparse",
            65536,
            tflops=380.0,
            world_size=2,
            mask_variant="b128",
            cp_mechanism="ring_p2p",
            backend="triton_block_sparse",
            cell_id="cp-t-unnamed",
        ),
        _row(
            "triton_block_sparse",
            "block_sparse",
            65536,
            tflops=380.0,
            world_size=2,
            mask_variant="b128",
            cp_mechanism="ulysses",
            backend=tiles,
            cell_id="cp-t",
        ),
    ]
    vs = queries.cp_vs_single(_cells(rows))
    t = vs.filter(pl.col("kernel") == "triton_block_sparse")
    assert t.get_column("cell_id").to_list() == ["cp-t"]
    assert t.item(0, "ratio") == pytest.approx(0.95)  # the b128 single cell only, not b64's
    vs = vs.filter(pl.col("kernel") == "cudnn")
    assert vs.height == 1
    assert vs.item(0, "tokens_per_gpu") == 32768
    assert vs.item(0, "single_tflops") == pytest.approx(600.0)
    assert vs.item(0, "ratio") == pytest.approx(0.9)


def test_sparse_vs_dense_reads_the_dense_full_mask_cell_of_the_same_shape() -> None:
    sparse = dict(mask="block_sparse", block_size=128, density=0.5, mask_variant="b128-d0.5")
    rows = [
        _row("sdpa_cudnn", "full", 65536, tflops=600.0, median_ms=10.0, cell_id="dense64"),
        _row("sdpa_cudnn", "full", 65536, tflops=500.0, median_ms=12.0, heads_kv=2, cell_id="dense64-gqa"),
        _row("sdpa_cudnn", "causal", 65536, tflops=580.0, median_ms=5.2, cell_id="causal64"),  # not the reference
        _row("fa4", "full", 65536, tflops=650.0, median_ms=9.2, cell_id="fa4-64"),  # another dense kernel
        _row("triton_block_sparse", s=65536, tflops=540.0, median_ms=5.5, cell_id="t64", **sparse),
        _row("triton_block_sparse", s=65536, tflops=450.0, median_ms=6.6, heads_kv=2, cell_id="t64-gqa", **sparse),
        _row("triton_block_sparse", s=131072, tflops=520.0, median_ms=23.0, cell_id="t128", **sparse),  # no dense
        _row("flex", s=65536, tflops=300.0, median_ms=9.9, pass_="bwd", cell_id="f64-bwd", **sparse),
    ]
    for r in rows:
        if "pass_" in r:
            r["pass"] = r.pop("pass_")
    vs = queries.sparse_vs_dense(_cells(rows))
    # GQA (fewer KV heads) sorts first; the flex backward and the 128K cell have no dense match
    assert vs.get_column("cell_id").to_list() == ["t64-gqa", "t64"]
    assert vs.get_column("dense_tflops").to_list() == pytest.approx([500.0, 600.0])
    assert vs.get_column("ratio").to_list() == pytest.approx([0.9, 0.9])
    assert vs.get_column("speedup").to_list() == pytest.approx([12.0 / 6.6, 10.0 / 5.5])


def test_sparse_side_by_side_puts_each_kernels_figure_or_status_on_one_line() -> None:
    sparse = dict(mask="block_sparse", block_size=64, density=0.5, mask_variant="b64-d0.5", spec="s", sweep="sparse")
    rows = [
        _row("triton_block_sparse", s=16384, tflops=440.0, cell_id="t", **sparse),
        _row("vsa_triton", s=16384, tflops=385.0, cell_id="v", **sparse),
        _row("flex", s=16384, tflops=116.0, cell_id="f", **sparse),
        _row("flashinfer_block_sparse", s=16384, status="unsupported", cell_id="fi", **sparse),
        _row("triton_block_sparse", s=16384, tflops=430.0, heads_kv=2, cell_id="t-gqa", **sparse),
        _row("vsa_triton", s=16384, status="unsupported", heads_kv=2, cell_id="v-gqa", **sparse),
        _row("flex", s=16384, status="oom", heads_kv=2, cell_id="f-gqa", **sparse),
        _row("sdpa_cudnn", "full", 16384, tflops=600.0, cell_id="dense"),
    ]  # not a sparse cell
    table, kernels = queries.sparse_side_by_side(_cells(rows))
    assert kernels == ["flashinfer_block_sparse", "flex", "triton_block_sparse", "vsa_triton"]
    assert table.height == 2 and table.get_column("heads_kv").to_list() == [2, 8]
    gqa, mha = table.row(0, named=True), table.row(1, named=True)
    assert (gqa["triton_block_sparse"], gqa["vsa_triton"], gqa["flex"]) == ("430.0", "unsupported", "oom")
    assert gqa["flashinfer_block_sparse"] is None  # never run on this shape: an empty cell, not a status
    assert gqa["best"] == "triton_block_sparse"
    assert (mha["vsa_triton"], mha["flex"], mha["flashinfer_block_sparse"]) == ("385.0", "116.0", "unsupported")
    assert mha["best"] == "triton_block_sparse" and mha["block_size"] == 64 and mha["density"] == 0.5
    # the line's command: every kernel of it, this mask variant, length, heads and pass
    only = mha["repro"].split(" --only ")[1:]
    assert "mask_variant=b64-d0.5" in only and "heads=8:8" in only and "seqlen=16384" in only
    assert not any(o.startswith("kernel=") for o in only) and mha["repro"].startswith("longca run --spec specs/")
    assert queries.sparse_side_by_side(_cells(rows[-1:]))[1] == []


def test_measurement_time_counts_each_cells_wall_once() -> None:
    rows = [
        _row(cell_id="a", spec="s", sweep="w", samples_ms=[100.0, 100.0], cell_wall_s=1.0, mask_sample=0),
        _row(cell_id="a", spec="s", sweep="w", samples_ms=[200.0], cell_wall_s=1.0, mask_sample=1),
        _row(cell_id="b", spec="s", sweep="w", samples_ms=[50.0], cell_wall_s=3.0),
        _row(cell_id="c", spec="s", sweep="w", samples_ms=[50.0], cell_wall_s=None),  # no wall: left out
        _row(cell_id="d", spec="s", sweep="w", status="unsupported", samples_ms=None, cell_wall_s=0.5),
    ]
    t = queries.measurement_time(pl.from_arrow(to_table(rows)))
    assert t.height == 1 and t.item(0, "cells") == 3
    assert t.item(0, "timed_s") == pytest.approx(0.45)
    assert t.item(0, "wall_s") == pytest.approx(4.5)
    assert t.item(0, "timed_share") == pytest.approx(0.1)


def test_measurement_phases_add_up_to_the_wall_of_cells_with_phase_times() -> None:
    w = dict(spec="s", sweep="w")
    rows = [
        _row(
            cell_id="a",
            **w,
            mask_sample=0,
            samples_ms=[100.0, 100.0],
            warmup_s=0.3,
            compile_s=0.1,
            timer_wall_s=0.6,
            mask_build_s=0.05,
            check_s=0.2,
            cell_wall_s=1.5,
        ),
        _row(
            cell_id="a",
            **w,
            mask_sample=1,
            samples_ms=[200.0],
            warmup_s=0.2,
            compile_s=0.0,
            timer_wall_s=0.35,
            mask_build_s=0.05,
            check_s=0.2,
            cell_wall_s=1.5,
        ),
        _row(cell_id="b", **w, samples_ms=[50.0], cell_wall_s=3.0, schema_version=1),  # schema 1: left out
        _row(cell_id="c", **w, status="unsupported", samples_ms=None, cell_wall_s=0.5),  # all of it is rest
        # compilation longer than the warm-up (outside the timer, like a CP plan): the excess leaves `rest`
        # and an idle pause before its measurement (repeat.cooldown_s) is its own phase
        _row(
            cell_id="d",
            **w,
            samples_ms=[100.0],
            warmup_s=0.1,
            compile_s=0.3,
            timer_wall_s=0.25,
            mask_build_s=0.0,
            check_s=0.0,
            cooldown_s=0.2,
            cell_wall_s=1.0,
        ),
    ]
    df = pl.from_arrow(to_table(rows))
    t = queries.measurement_phases(df)
    assert t.height == 1 and t.item(0, "cells") == 3
    assert t.item(0, "wall_s") == pytest.approx(3.0)
    want = {
        "timed": 0.5,
        "warmup": 0.4,
        "other_timer": 0.1,
        "check": 0.2,
        "compile": 0.4,
        "mask_build": 0.1,
        "cooldown": 0.2,
        "rest": 0.25 + 0.5 + 0.35,
    }
    for phase, seconds in want.items():
        assert t.item(0, f"{phase}_s") == pytest.approx(seconds), phase
        assert t.item(0, f"{phase}_share") == pytest.approx(seconds / 3.0), phase
    assert sum(t.item(0, f"{p}_share") for p in queries.PHASES) == pytest.approx(1.0)
    # the existing figure still counts every cell with a wall, old rows included
    assert queries.measurement_time(df).item(0, "cells") == 4


def test_measurement_phases_of_schema_1_rows_only_is_empty() -> None:
    rows = [_row(cell_id="b", spec="s", sweep="w", samples_ms=[50.0], cell_wall_s=3.0, schema_version=1)]
    assert queries.measurement_phases(pl.from_arrow(to_table(rows))).height == 0


def _linear_case(soft: list[float], lin: list[float]) -> pl.DataFrame:
    lengths = [1024 * 2**i for i in range(len(soft))]
    rows = [_row("softmax_k", "causal", s, tokens_per_s=t) for s, t in zip(lengths, soft)]
    rows += [
        _row("lin", "causal", s, tokens_per_s=t, kernel_family="linear", tflops=None) for s, t in zip(lengths, lin)
    ]
    return queries.linear_vs_softmax(_cells(rows))[1]


def test_linear_crossover() -> None:
    cross = _linear_case([100, 80, 60, 40], [50, 70, 65, 60])
    assert cross.select("crossover", "below").row(0) == (4096, 2048)
    # ahead at 2048, behind at 4096, ahead after: the crossover is where it stays ahead
    cross = _linear_case([100, 60, 70, 40], [50, 65, 60, 60])
    assert cross.select("crossover", "below").row(0) == (8192, 4096)
    assert _linear_case([10, 10], [20, 20]).select("crossover", "below").row(0) == (1024, None)
    assert _linear_case([30, 30], [20, 20]).select("crossover", "below").row(0) == (None, 2048)


def test_linear_crossover_carries_the_command_for_every_kernel_it_compares() -> None:
    lengths = [1024, 2048]
    extra = dict(spec="s", mask_variant="default")
    rows = [_row("soft", "causal", s, tokens_per_s=10.0, sweep="linear_softmax", **extra) for s in lengths]
    rows += [
        _row("lin", "causal", s, tokens_per_s=20.0, kernel_family="linear", tflops=None, sweep="linear", **extra)
        for s in lengths
    ]
    repro = queries.linear_vs_softmax(_cells(rows))[1].get_column("repro")[0]
    assert repro.startswith("longca run --spec specs/s.yaml --sweep linear --sweep linear_softmax --only mask=causal")
    only = [o.split("=")[0] for o in repro.split(" --only ")[1:]]
    assert only == ["mask", "mask_variant", "heads", "head_dim", "dtype", "pass", "batch"]  # no kernel, no length


def test_linear_series_names_best_softmax_per_length() -> None:
    rows = [
        _row("s1", "causal", 1024, tokens_per_s=10.0),
        _row("s2", "causal", 1024, tokens_per_s=30.0),
        _row("lin", "causal", 1024, tokens_per_s=20.0, kernel_family="linear", tflops=None),
    ]
    series, _ = queries.linear_vs_softmax(_cells(rows))
    soft = series.filter(pl.col("series") == "best softmax")
    assert soft.select("kernel", "tokens_per_s").row(0) == ("s2", 30.0)


def test_linear_best_softmax_only_where_every_softmax_kernel_has_a_row() -> None:
    lin = dict(kernel_family="linear", tflops=None)
    rows = [_row("fast", "causal", s, tokens_per_s=100.0) for s in (1024, 2048)]
    rows += [_row("slow", "causal", s, tokens_per_s=5.0) for s in (1024, 2048, 4096)]
    rows += [_row("fast", "causal", 8192, status="oom")]  # tried and failed: the length still counts
    rows += [_row("slow", "causal", 8192, tokens_per_s=4.0)]
    rows += [_row("never", "causal", 2048, status="unsupported")]  # runs nowhere: not a missing kernel
    rows += [_row("lin", "causal", s, tokens_per_s=50.0, **lin) for s in (1024, 2048, 4096, 8192)]
    series, cross = queries.linear_vs_softmax(_cells(rows))
    soft = series.filter(pl.col("series") == "best softmax")
    # 4096: only the slow kernel has run there (a partial sweep), so no "best softmax" point
    assert soft.get_column("seqlen_q").to_list() == [1024, 2048, 8192]
    assert soft.get_column("kernel").to_list() == ["fast", "fast", "slow"]
    assert cross.select("crossover", "below").row(0) == (8192, 2048)


def test_linear_compares_the_same_kv_heads_only() -> None:
    rows = [
        _row("soft_gqa", "causal", 1024, heads_kv=2, tokens_per_s=100.0),
        _row("soft_mha", "causal", 1024, tokens_per_s=10.0),
        _row("lin", "causal", 1024, tokens_per_s=20.0, kernel_family="linear", tflops=None),
    ]
    series, cross = queries.linear_vs_softmax(_cells(rows))
    assert series.filter(pl.col("series") == "best softmax").get_column("kernel").to_list() == ["soft_mha"]
    assert cross.select("group", "crossover").row(0) == (
        "causal fwd H=8:8 D=64 bf16 on " + series.item(0, "machine"),
        1024,
    )


def test_fixture_rows_cover_every_family() -> None:
    df = pl.from_arrow(synthetic_table())
    c = queries.cells(df)
    assert set(df.get_column("status").unique()) >= {"ok", "unsupported", "oom", "error", "incorrect"}
    assert queries.sparse_cells(c).height and queries.cp_cells(c).height
    assert queries.linear_vs_softmax(c)[0].height
    assert queries.non_ok(df, c).get_column("rows").sum() == df.filter(pl.col("status") != "ok").height


def _stamped(digest: str, day: int, tflops: float, **kw: Any) -> dict[str, Any]:
    """A row of cell 'k/full/1024/fwd' measured under the protocol whose digest is `digest`."""
    from datetime import datetime

    kw = {"spec": "s", "sweep": "dense", **kw}
    return _row(
        tflops=tflops,
        cell_id=f"k/full/1024/fwd@{digest}",
        cell_digest=digest,
        timestamp=datetime(2026, 12, day, tzinfo=UTC),
        **kw,
    )


def test_supersede_draws_the_latest_protocol_of_a_cell_and_returns_the_rest() -> None:
    rows = pl.from_arrow(
        to_table(
            [
                _stamped("aaaa", 1, 10.0, mask_sample=0),
                _stamped("aaaa", 1, 12.0, mask_sample=1),
                _stamped("bbbb", 3, 20.0),
                _row(tflops=5.0, spec="s", sweep="dense"),
            ]
        )
    )
    current, old = queries.supersede(rows)
    assert sorted(old.get_column("tflops").to_list()) == [10.0, 12.0]  # both samples of the older digest
    assert sorted(current.get_column("tflops").to_list()) == [5.0, 20.0]  # the newer digest; a row without one
    assert current.columns == rows.columns and old.columns == rows.columns
    assert queries.cells(current).filter(pl.col("cell_id").str.contains("@")).get_column("tflops").to_list() == [20.0]


def test_supersede_is_decided_by_time_not_by_file_order() -> None:
    rows = pl.from_arrow(to_table([_stamped("bbbb", 3, 20.0), _stamped("aaaa", 1, 10.0)]))
    current, old = queries.supersede(rows)
    assert current.get_column("cell_digest").to_list() == ["bbbb"]
    assert old.get_column("cell_digest").to_list() == ["aaaa"]


def test_supersede_keeps_each_machine_spec_and_sweep_apart() -> None:
    rows = pl.from_arrow(
        to_table(
            [
                _stamped("aaaa", 1, 10.0),
                _stamped("bbbb", 3, 20.0, host="other"),  # same cell id, two machines
                _stamped("cccc", 2, 30.0, sweep="long"),  # same cell id in another sweep
            ]
        )
    )
    current, old = queries.supersede(rows)
    assert old.height == 0 and current.height == 3


def test_supersede_of_rows_without_digests_changes_nothing() -> None:
    rows = pl.from_arrow(to_table([_row(tflops=1.0), _row(tflops=2.0, mask="causal")]))
    current, old = queries.supersede(rows)
    assert current.equals(rows) and old.height == 0


def test_throttle_names_decode_nvml_bits_and_keep_unknown_ones() -> None:
    assert queries.throttle_names("0x0") == []
    assert queries.throttle_names(None) == []
    assert queries.throttle_names("0x4") == ["sw_power_cap"]
    assert queries.throttle_names("0x24") == ["sw_power_cap", "sw_thermal"]
    assert queries.throttle_names("0x1004") == ["sw_power_cap", "0x1000"]


def test_clocks_per_sweep_over_ok_rows_with_a_clock() -> None:
    w = dict(spec="s", sweep="w")
    rows = [
        _row(cell_id="a", **w, clock_start_mhz=1980, clock_end_mhz=1980, throttle_reasons="0x0"),
        _row(cell_id="b", **w, clock_start_mhz=1900, clock_end_mhz=1700, throttle_reasons="0x4"),
        _row(cell_id="c", **w, clock_start_mhz=1800, clock_end_mhz=1750, throttle_reasons="0x24"),
        _row(cell_id="d", **w, clock_start_mhz=None, clock_end_mhz=None),  # CPU row: no clock
        _row(cell_id="e", **w, status="oom", clock_start_mhz=500, clock_end_mhz=500, throttle_reasons="0x8"),
        _row(cell_id="f", spec="s", sweep="v", clock_start_mhz=1000, clock_end_mhz=990, throttle_reasons="0x0"),
    ]
    out = queries.clocks(pl.from_arrow(to_table(rows)))
    assert out.get_column("sweep").to_list() == ["v", "w"]
    w_row = out.row(1, named=True)
    assert w_row["rows"] == 3 and w_row["start_mhz"] == 1900 and w_row["end_mhz"] == 1750
    assert w_row["power_capped"] == pytest.approx(2 / 3)
    assert w_row["reasons"] == "sw_power_cap, sw_thermal"  # the oom row's hw_slowdown is not counted
    assert out.row(0, named=True)["reasons"] == "" and out.row(0, named=True)["power_capped"] == 0


def test_intervals_count_rows_within_2_percent_on_the_drawn_time_apart_from_full_ranges() -> None:
    w = dict(spec="s", sweep="w", ci_target=0.01)
    tight = [1.0 + 0.001 * i for i in range(20)]  # 20 samples: a 95% interval within +-1%
    wide = [1.0 + 0.01 * i for i in range(20)]  # spread 19%: its interval is about +-6%
    rows = [
        _row(cell_id="tight", **w, samples_ms=tight, median_ms=1.0095, ci_met=True),
        _row(cell_id="wide", **w, samples_ms=wide, median_ms=1.095, ci_met=False),
        # eager wide, but the drawn time is the graph replay's, whose interval is tight
        _row(
            cell_id="graph",
            **w,
            samples_ms=wide,
            median_ms=1.095,
            graph_median_ms=0.5,
            graph_ci_low_ms=0.499,
            graph_ci_high_ms=0.502,
            ci_met=False,
        ),
        # a call over 1 s stops at 3 samples: its interval is the whole range (75% coverage)
        _row(cell_id="three", **w, samples_ms=[2000.0, 2010.0, 2020.0], median_ms=2010.0, ci_met=False),
        # a replay's sample count is not stored: one of 1 s or more may have stopped at 3
        _row(
            cell_id="slow_graph",
            **w,
            samples_ms=[1600.0] * 3,
            median_ms=1600.0,
            graph_median_ms=1500.0,
            graph_ci_low_ms=1490.0,
            graph_ci_high_ms=1510.0,
            ci_met=False,
        ),
        _row(cell_id="failed", **w, status="error", samples_ms=tight),  # not ok: not counted
        # an earlier protocol's single sample: no interval at all, never within
        _row(cell_id="one", spec="s", sweep="w", samples_ms=[5.0], median_ms=5.0),
    ]
    out = queries.intervals(pl.from_arrow(to_table(rows)))
    assert out.select("target", "rows", "full_range", "within", "met").rows() == [
        ("+-1.0%", 5, 2, 4, 1),
        ("none", 1, 1, 0, 0),
    ]
    adaptive = out.row(0, named=True)
    assert adaptive["share"] == 0.8 and adaptive["share_95"] == pytest.approx(2 / 3, abs=1e-3)


def test_status_groups_do_not_depend_on_the_order_of_the_rows() -> None:
    # two groups of one kernel with as many cells each, and cells alike but for their digests: the
    # published Status page must not reorder them from one build to the next
    rows = [
        _row(status="unsupported", reason=reason, s=s, cell_id=f"k/full/{s}/fwd@{reason[:1]}{i}")
        for reason in ("a not installed", "b refused")
        for i, s in enumerate((1024, 1024, 2048))
    ]
    frame = pl.from_arrow(to_table(rows))
    orders = []
    for seed in (1, 2, 3):
        shuffled = frame.sample(fraction=1.0, shuffle=True, seed=seed)
        groups = queries.non_ok_groups(queries.non_ok(shuffled, queries.cells(shuffled)))
        orders.append(groups.select("reason", "members").rows())
    assert orders[0] == orders[1] == orders[2]
    assert [r for r, _ in orders[0]] == ["a not installed", "b refused"]


def test_cells_do_not_depend_on_the_order_of_the_rows() -> None:
    rows = pl.from_arrow(synthetic_table())
    shuffled = rows.sample(fraction=1.0, shuffle=True, seed=3)
    assert not rows.equals(shuffled)
    assert queries.cells(rows).equals(queries.cells(shuffled))


def _shape(
    kernel: str, s: int, d: int, dtype: str = "bf16", status: str = "ok", tflops: float = 100.0, **kw: Any
) -> dict[str, Any]:
    return _row(
        kernel,
        s=s,
        head_dim=d,
        dtype=dtype,
        status=status,
        tflops=tflops,
        cell_id=f"{kernel}/full/{s}/{d}/{dtype}",
        **kw,
    )


def test_shape_study_is_taken_at_the_length_with_most_head_dims_and_dtypes() -> None:
    c = _cells(
        [
            _shape("a", 1024, 128),
            _shape("a", 1024, 64),  # two variants: sweeps that happen to meet
            _shape("a", 4096, 128, tflops=300.0),
            _shape("a", 4096, 64, tflops=200.0),
            _shape("a", 4096, 256, tflops=350.0),
            _shape("a", 4096, 128, "fp16", tflops=310.0),
            _shape("b", 4096, 128, tflops=250.0),
            _shape("b", 4096, 64, tflops=150.0),
            _shape("b", 4096, 256, status="unsupported"),
            _shape("c", 4096, 128),
            _shape("c", 4096, 64, status="oom"),
        ]
    )  # one ok variant: nothing to compare
    study = queries.shape_study(c)
    assert set(study.get_column("seqlen_q")) == {4096}
    assert sorted(study.get_column("kernel").unique()) == ["a", "b"]
    table, variants = queries.shape_table(study)
    assert variants == ["D=64 bf16", "D=128 bf16", "D=128 fp16", "D=256 bf16"]
    by_kernel = {r["kernel"]: r for r in table.iter_rows(named=True)}
    assert [by_kernel["a"][v] for v in variants] == [200.0, 300.0, 310.0, 350.0]
    # b's D=256 cell is not ok: its field stays empty (the Status page has the reason), never a number
    assert [by_kernel["b"][v] for v in variants] == [150.0, 250.0, None, None]


def test_each_shape_line_carries_the_command_that_measures_its_cells_again() -> None:
    where = dict(spec="s", sweep="shapes", mask_variant="default")
    c = _cells([_shape("a", 4096, 128, **where), _shape("a", 4096, 64, **where), _shape("a", 4096, 256, **where)])
    table, _ = queries.shape_table(queries.shape_study(c))
    only = table.get_column("repro")[0].split(" --only ")[1:]
    assert table.get_column("repro")[0].startswith("longca run --spec specs/s.yaml --sweep shapes ")
    assert "kernel=a" in only and "seqlen=4096" in only and "mask_variant=default" in only
    assert not any(o.startswith(("head_dim=", "dtype=")) for o in only)  # every variant of the line


def test_shape_study_of_rows_with_one_head_dim_is_empty() -> None:
    c = _cells([_shape("a", 1024, 128), _shape("a", 4096, 128)])
    assert queries.shape_study(c).is_empty()
    table, variants = queries.shape_table(queries.shape_study(c))
    assert table.is_empty() and variants == []


def test_length_charts_leave_a_kernels_lone_shapes_to_the_study() -> None:
    c = _cells(
        [
            _shape("a", 1024, 128),
            _shape("a", 4096, 128),
            _shape("a", 4096, 64),  # a: line + lone D=64
            _shape("b", 4096, 64),  # b: only one shape at one length: its only point, kept
            _shape("c", 1024, 64),
            _shape("c", 4096, 64),
            _shape("c", 4096, 256),
        ]
    )
    drawn, studied = queries.for_length_charts(queries.mask_cells(c))
    assert sorted(zip(studied.get_column("kernel"), studied.get_column("head_dim"))) == [("a", 64), ("c", 256)]
    assert drawn.height + studied.height == 7
    assert ("b", 64) in set(zip(drawn.get_column("kernel"), drawn.get_column("head_dim")))


def test_shape_study_pairs_a_sampled_mask_only_at_the_same_number_of_draws() -> None:
    # one sweep drew 3 documents layouts, another 1: their medians are over different masks
    c = _cells(
        [
            _shape("a", 4096, 128, mask="causal_document", mask_samples=3),
            _shape("a", 4096, 64, mask="causal_document", mask_samples=1),
            _shape("a", 4096, 256, mask="causal_document", mask_samples=3),
        ]
    )
    study = queries.shape_study(c)
    assert sorted(study.get_column("head_dim")) == [128, 256]
    table, variants = queries.shape_table(study)
    assert variants == ["D=128 bf16", "D=256 bf16"] and table.get_column("mask_samples").to_list() == [3]


def test_agreement_summarises_the_full_length_comparisons_per_kernel_pass_and_comparator() -> None:
    w = dict(spec="s", sweep="long")
    rows = [
        _row(cell_id="f1", s=65536, agree_kernel="fa4", agree_rel_diff=0.001, **w, **{"pass": "fwd"}),
        _row(cell_id="f2", s=524288, agree_kernel="fa4", agree_rel_diff=0.002, **w, **{"pass": "fwd"}),
        _row(
            cell_id="b1",
            s=524288,
            agree_kernel="fa4",
            agree_rel_diff=0.002,
            agree_rel_diff_dq=0.004,
            agree_rel_diff_dk=0.006,
            agree_rel_diff_dv=0.003,
            **w,
            **{"pass": "bwd"},
        ),
        # measured before gradients were compared (schema 6): no gradient difference
        _row(cell_id="b0", s=131072, agree_kernel="fa4", agree_rel_diff=0.001, **w, **{"pass": "bwd"}),
        _row(
            cell_id="bad",
            s=131072,
            status="incorrect",
            tflops=None,
            agree_kernel="fa4",
            agree_rel_diff=0.001,
            agree_rel_diff_dq=0.3,
            **w,
            **{"pass": "bwd"},
        ),
        _row(
            cell_id="lone", s=262144, agree_reason="no second kernel serves this cell: fa4: no", **w, **{"pass": "fwd"}
        ),
        _row(cell_id="short", s=4096, **w, **{"pass": "fwd"}),  # within the check length: not listed
    ]
    got = {(r["pass"], r["comparator"]): r for r in queries.agreement(pl.from_arrow(to_table(rows))).to_dicts()}
    assert set(got) == {("fwd", "fa4"), ("bwd", "fa4"), ("fwd", "none")}
    fwd, bwd, none = got["fwd", "fa4"], got["bwd", "fa4"], got["fwd", "none"]
    assert (fwd["rows"], fwd["lengths"], fwd["max_out"], fwd["max_grad"], fwd["grads_compared"]) == (
        2,
        "64K-512K",
        0.002,
        None,
        0,
    )
    assert (bwd["rows"], bwd["lengths"], bwd["max_grad"], bwd["grads_compared"], bwd["incorrect"]) == (
        3,
        "128K-512K",
        0.3,
        2,
        1,
    )
    assert (none["rows"], none["lengths"], none["reason"]) == (1, "256K", "no second kernel serves this cell: fa4: no")


def _timed(kernel: str, eager_ms: float, graph_ms: float | None = None, reason: str | None = None) -> dict[str, Any]:
    """A 1 ms-per-TFLOP/s cell: 100 TFLOP/s at `eager_ms` 1.0, its replay (if any) at `graph_ms`."""
    graph = {} if graph_ms is None else dict(graph_median_ms=graph_ms, graph_ci_low_ms=graph_ms * 0.99,
                                             graph_ci_high_ms=graph_ms * 1.01)  # fmt: skip
    return _row(kernel, tflops=100.0 / eager_ms, median_ms=eager_ms, ci_low_ms=eager_ms * 0.98,
                ci_high_ms=eager_ms * 1.02, graph_reason=reason, **graph)  # fmt: skip


def test_kernel_time_ranks_replays_and_marks_squares_with_eager_only_kernels() -> None:
    # a's eager call is launch-bound (0.5 ms, its kernel 0.1 ms), b's is not (0.4 ms, replayed 0.38)
    c = _cells([_timed("a", 0.5, 0.1), _timed("b", 0.4, 0.38)])
    eager = queries.choose(queries.at_time(c, Time.EAGER)).row(0, named=True)
    kernel = queries.choose(queries.at_time(c, Time.KERNEL)).row(0, named=True)
    assert (eager["kernel"], eager["runner_up"], eager["time"]) == ("b", "a", "eager")
    assert (kernel["kernel"], kernel["runner_up"], kernel["time"]) == ("a", "b", "kernel")
    # the replay's figures and interval: 100 TFLOP/s at 1 ms, so 1000 at 0.1 ms (0.099-0.101)
    assert kernel["tflops"] == pytest.approx(1000.0) and kernel["margin"] == pytest.approx(0.38 / 0.1 - 1)
    assert (kernel["tflops_ci_low"], kernel["tflops_ci_high"]) == (
        pytest.approx(1000 / 1.01),
        pytest.approx(1000 / 0.99),
    )
    assert kernel["runner_up_tflops_ci_high"] == pytest.approx(100 / 0.38 / 0.99)
    assert kernel["eager_only_faster"] == 0 and kernel["timing"] == "graph replay"
    # c was measured without a capture (an earlier protocol): at kernel time it competes at its eager
    # time, and it was faster than a at eager time: the square is marked; d, slower at eager time, is not
    for other, eager_ms, faster in (("c", 0.2, 1), ("d", 1.0, 0)):
        c = _cells([_timed("a", 0.5, 0.1), _timed(other, eager_ms)])
        kernel = queries.choose(queries.at_time(c, Time.KERNEL)).row(0, named=True)
        assert (kernel["kernel"], kernel["eager_only_faster"]) == ("a", faster)
        assert queries.choose(queries.at_time(c, Time.EAGER)).item(0, "eager_only_faster") == 0


@pytest.mark.parametrize(
    ("graph_ms", "reason", "timed"),
    [
        (0.1, None, True),  # replayed
        (None, "eager median 30 ms >= repeat.graph_below_ms 20: launch time is negligible", True),
        (None, "not capturable in a CUDA graph: RuntimeError: x", True),  # users pay its launches too
        (None, "backward cells are timed eagerly only (no capture of autograd's backward)", False),
        (None, None, False),  # measured without repeat.graph
    ],
)
def test_which_cells_have_a_kernel_time(graph_ms: float | None, reason: str | None, timed: bool) -> None:
    c = _cells([_timed("a", 0.5, graph_ms, reason)])
    assert c.item(0, "kernel_timed") is timed


def test_context_parallel_cells_say_they_were_not_captured_in_the_words_the_report_reads() -> None:
    from longca.run.ranks import CP_GRAPH_REASON

    assert queries.GRAPH_NOT_TRIED in CP_GRAPH_REASON

"""longca.report.leases: how far a cell's median moves between runs, and the Choose page's use of it."""

from __future__ import annotations

import polars as pl
import pytest
from report_rows import synthetic_table

from longca.report import leases, queries


def _rows(run: str, medians: dict[tuple[str, int], float], status: str = "ok") -> pl.DataFrame:
    return pl.DataFrame(
        {
            "cell_digest": [d for d, _ in medians],
            "mask_sample": [s for _, s in medians],
            "run_id": [run] * len(medians),
            "median_ms": list(medians.values()),
            "status": [status] * len(medians),
            "extra": ["ignored"] * len(medians),
        }
    )


def test_every_two_runs_of_a_cell_and_draw_make_a_pair() -> None:
    # cell a draw 0 in three runs (10, 10.2, 9.9 ms), cell b in two (20, 21); draw 1 of a only once
    published = _rows("r3", {("a", 0): 9.9, ("b", 0): 21.0, ("a", 1): 5.0})
    earlier = pl.concat([_rows("r1", {("a", 0): 10.0, ("b", 0): 20.0}), _rows("r2", {("a", 0): 10.2})])
    moves = leases.between_runs(published, earlier)
    d = sorted([abs(10 / 10.2 - 1), abs(10 / 9.9 - 1), abs(10.2 / 9.9 - 1), abs(20 / 21 - 1)])
    assert (moves.pairs, moves.cells, moves.runs) == (4, 2, 3)
    assert moves.median == pytest.approx((d[1] + d[2]) / 2)
    assert moves.p95 == pytest.approx(d[-1])  # 4 pairs: the 95th percentile is the largest
    assert "in 95% of 4 pairs (2 cells measured in two or more of 3 runs)" in moves.sentence()
    # rows of one run never pair, failed rows never count, and nothing to pair gives None
    assert leases.between_runs(published) is None
    assert leases.between_runs(published, _rows("r1", {("a", 0): 99.0}, status="error")) is None
    assert leases.between_runs(pl.DataFrame()) is None


def test_a_lead_across_runs_is_clear_only_beyond_the_move_between_runs() -> None:
    c = queries.cells(pl.from_arrow(synthetic_table()))
    apart = c.with_columns(run_ids=pl.lit("run-") + pl.col("kernel"))  # every kernel in a run of its own
    for cells, across in ((c, False), (apart, True)):
        base = queries.choose(cells).filter(pl.col("runner_up").is_not_null())
        widened = queries.choose(cells, between_runs=0.05).filter(pl.col("runner_up").is_not_null())
        factor = 1.05 if across else 1.0
        expect = widened.get_column("tflops_ci_low") > widened.get_column("runner_up_tflops_ci_high") * factor
        assert widened.get_column("lead_clear").to_list() == expect.to_list()
        flipped = (base.get_column("lead_clear") & ~widened.get_column("lead_clear")).sum()
        assert (flipped > 0) == across  # one run: the move between runs does not apply


def test_the_rerun_interval_widens_a_rows_own_interval_to_the_move_between_runs() -> None:
    d = pl.DataFrame({"m": [100.0, 100.0], "lo": [99.0, 90.0], "hi": [101.0, 101.0], "tf": [500.0, 500.0]})
    low, high = leases.rerun_interval(0.05, pl.col("m"), pl.col("lo"), pl.col("hi"))
    got = d.select(low.alias("low"), high.alias("high"))
    assert got.rows() == [(pytest.approx(95.0), pytest.approx(105.0)), (90.0, pytest.approx(105.0))]  # never narrower
    # a rate is inverse to time: 5% more or less time is 500/1.05 .. 500/0.95 TFLOP/s
    low, high = leases.rerun_interval(0.05, pl.col("tf"), pl.col("tf") * 0.99, pl.col("tf") * 1.01, rate=True)
    assert d.select(low.alias("low"), high.alias("high")).row(0) == (
        pytest.approx(500 / 1.05),
        pytest.approx(500 / 0.95),
    )
    with pytest.raises(ValueError, match=r"p95 1.2: allowed: a fraction in \[0, 1\)"):
        leases.rerun_interval(1.2, pl.col("m"), pl.col("lo"), pl.col("hi"))

"""longca.report.leases: how far a cell's median moves between runs, and the Choose page's use of it."""

from __future__ import annotations

import polars as pl
import pytest
from report_rows import synthetic_table

from longca.report import leases, queries
from longca.vocab import Time


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
    # how far apart, whichever run is slower: the larger median over the smaller, minus 1
    d = sorted([10.2 / 10 - 1, 10 / 9.9 - 1, 10.2 / 9.9 - 1, 21 / 20 - 1])
    assert (moves.pairs, moves.cells, moves.runs) == (4, 2, 3)
    assert moves.median == pytest.approx((d[1] + d[2]) / 2)
    assert moves.p95 == pytest.approx(d[-1])  # 4 pairs: the 95th percentile is the largest
    assert "in 95% of 4 pairs (2 cells measured in two or more of 3 runs)" in moves.sentence()
    # a pair belongs to the time scale of its shorter median: 9.9 ms is under 10, 10.0 is not
    (mid, long) = moves.scales
    assert (mid.label(), mid.pairs, mid.p95) == ("1-10 ms", 2, pytest.approx(10.2 / 9.9 - 1))
    assert (long.label(), long.pairs, long.p95) == ("from 10 ms", 2, pytest.approx(21 / 20 - 1))
    assert "1-10 ms: " in moves.sentence() and "from 10 ms: " in moves.sentence()
    # rows of one run never pair, failed rows never count, and nothing to pair gives None
    assert leases.between_runs(published) is None
    assert leases.between_runs(published, _rows("r1", {("a", 0): 99.0}, status="error")) is None
    assert leases.between_runs(pl.DataFrame()) is None


def test_each_row_is_widened_by_the_moves_of_its_own_time_scale() -> None:
    # 20 host-bound cells under 1 ms moved 2.25x between two runs, 20 cells of 50 ms by 1%, and
    # one 5 ms cell by 2%: too few pairs at its scale for a 95th percentile
    n = leases.MIN_PAIRS
    first = {**{(f"fast{i}", 0): 0.4 for i in range(n)}, **{(f"slow{i}", 0): 50.0 for i in range(n)}, ("mid", 0): 5.0}
    second = {k: {0.4: 0.9, 50.0: 50.5, 5.0: 5.1}[v] for k, v in first.items()}
    moves = leases.between_runs(_rows("r1", first), _rows("r2", second))
    assert [(s.label(), s.pairs) for s in moves.scales] == [("under 1 ms", n), ("1-10 ms", 1), ("from 10 ms", n)]
    fast, mid, slow = moves.scales
    assert (fast.p95, moves.used(fast)) == (pytest.approx(1.25), pytest.approx(1.25))
    assert (mid.p95, moves.used(mid)) == (pytest.approx(0.02), pytest.approx(1.25))  # too few: the widest move
    assert (slow.p95, moves.used(slow)) == (pytest.approx(0.01), pytest.approx(0.01))
    assert moves.scale_of(0.9) == fast and moves.scale_of(5.0) == mid and moves.scale_of(60.0) == slow
    rows = pl.DataFrame({"m": [0.5, 5.0, 60.0]})
    got = rows.select(moves.p95_at(pl.col("m"))).to_series().to_list()
    assert got == [pytest.approx(1.25), pytest.approx(1.25), pytest.approx(0.01)]
    low, high = leases.rerun_interval(moves.p95_at(pl.col("m")), pl.col("m"), pl.col("m"), pl.col("m"))
    bounds = rows.select(low.alias("low"), high.alias("high")).rows()
    assert bounds[0] == (pytest.approx(0.5 / 2.25), pytest.approx(0.5 * 2.25))  # a move over 100% stays valid
    assert bounds[2] == (pytest.approx(60 / 1.01), pytest.approx(60 * 1.01))
    # a scale no pair reached takes the widest measured move too
    only_slow = leases.between_runs(_rows("r1", {("s", 0): 50.0}), _rows("r2", {("s", 0): 51.0}))
    assert rows.select(only_slow.p95_at(pl.col("m"))).to_series().to_list() == [pytest.approx(0.02)] * 3


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
        # per row: the runner-up's own time scale's move (here 5% for every row, as an expression)
        per_row = queries.choose(cells, between_runs=pl.lit(0.05)).filter(pl.col("runner_up").is_not_null())
        assert per_row.get_column("lead_clear").to_list() == widened.get_column("lead_clear").to_list()
    # the expression is read on the runner-up's row: a huge move for one kernel blurs only the
    # leads over that kernel, across runs
    base = queries.choose(apart).filter(pl.col("runner_up").is_not_null())
    other = base.get_column("runner_up")[0]
    blur = pl.when(pl.col("kernel") == other).then(100.0).otherwise(0.0)
    got = queries.choose(apart, between_runs=blur).filter(pl.col("runner_up").is_not_null())
    expect = base.get_column("lead_clear") & (base.get_column("runner_up") != other)
    assert got.get_column("lead_clear").to_list() == expect.to_list()
    assert expect.sum() < base.get_column("lead_clear").sum()


def test_the_rerun_interval_widens_a_rows_own_interval_to_the_move_between_runs() -> None:
    d = pl.DataFrame({"m": [100.0, 100.0], "lo": [99.0, 90.0], "hi": [101.0, 101.0], "tf": [500.0, 500.0]})
    low, high = leases.rerun_interval(0.05, pl.col("m"), pl.col("lo"), pl.col("hi"))
    got = d.select(low.alias("low"), high.alias("high"))
    assert got.rows() == [(pytest.approx(100 / 1.05), pytest.approx(105.0)), (90.0, pytest.approx(105.0))]
    # a rate the same way: one median 1.05 times the other, whichever is the larger
    low, high = leases.rerun_interval(0.05, pl.col("tf"), pl.col("tf") * 0.99, pl.col("tf") * 1.01)
    assert d.select(low.alias("low"), high.alias("high")).row(0) == (pytest.approx(500 / 1.05), pytest.approx(525.0))
    with pytest.raises(ValueError, match=r"p95 -0.1: allowed: a move of 0 or more"):
        leases.rerun_interval(-0.1, pl.col("m"), pl.col("lo"), pl.col("hi"))


def test_kernel_time_pairs_replays_and_widens_replayed_cells_by_their_moves() -> None:
    # 0.5 ms eager calls moved 1.6x between two runs (the host); their replays (0.1 ms) by 2%;
    # cell c was replayed in one run only: no replayed pair
    first = _rows("r1", {("a", 0): 0.5, ("b", 0): 0.5, ("c", 0): 0.5}).with_columns(
        graph_median_ms=pl.Series([0.1, 0.1, None])
    )
    second = _rows("r2", {("a", 0): 0.8, ("b", 0): 0.8, ("c", 0): 0.8}).with_columns(
        graph_median_ms=pl.Series([0.102, 0.102, 0.1])
    )
    eager = leases.between_runs(first, second)
    replayed = leases.between_runs(first, second, time=Time.KERNEL)
    assert (eager.pairs, eager.p95) == (3, pytest.approx(0.6))
    assert (replayed.pairs, replayed.p95) == (2, pytest.approx(0.02))
    assert leases.between_runs(first.drop("graph_median_ms"), second, time=Time.KERNEL) is None
    # per cell at kernel time: a replayed cell by the replays' move, an eager one by the eager move
    cells = pl.DataFrame({"timing": ["graph replay", "eager"], "median_ms": [0.5, 0.5], "graph_median_ms": [0.1, None]})
    at_kernel = cells.select(leases.move_at(Time.KERNEL, eager, replayed)).to_series().to_list()
    assert at_kernel == [pytest.approx(0.02), pytest.approx(0.6)]
    at_eager = cells.select(leases.move_at(Time.EAGER, eager, replayed)).to_series().to_list()
    assert at_eager == [pytest.approx(0.6)] * 2
    no_replays = cells.select(leases.move_at(Time.KERNEL, eager, None)).to_series().to_list()
    assert no_replays == [pytest.approx(0.6)] * 2
    assert leases.move_at(Time.KERNEL, None, replayed) == 0.0

"""The committed result sets under `results/`: what a reader of the published rows relies on.

These are assembled on a workstation from device calls' aggregates (docs/gpu-host.md); a merge
step that repeats or damages rows would otherwise reach the report unnoticed.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from longca.store.aggregate import repeated_rows
from longca.store.schema import conform
from longca.vocab import Status

ROOT = Path(__file__).resolve().parents[2]
SETS = sorted([*ROOT.glob("results/*/all.parquet"), *ROOT.glob("results/*/reruns.parquet")])


def test_there_are_published_sets() -> None:
    assert any(p.parent.name == "h200" and p.name == "all.parquet" for p in SETS)


@pytest.mark.parametrize("path", SETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_published_set_holds_each_row_once_with_a_known_status(path: Path) -> None:
    rows = pl.from_arrow(conform(pq.read_table(path)))
    assert rows.height > 0
    assert rows.select(pl.col(c).null_count() for c in ("cell_digest", "run_id", "timestamp")).row(0) == (0, 0, 0)
    repeated = repeated_rows(path)
    assert not repeated, f"{path}: rows held more than once: {repeated[:5]}"
    assert set(rows["status"].unique()) <= {s.value for s in Status}


@pytest.mark.parametrize("path", SETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_ok_row_has_a_time_inside_its_interval(path: Path) -> None:
    ok = pl.from_arrow(conform(pq.read_table(path))).filter(pl.col("status") == Status.OK.value)
    assert (ok["median_ms"] > 0).all()
    with_ci = ok.filter(pl.col("ci_low_ms").is_not_null())  # rows before schema 4 have none stored
    inside = (pl.col("ci_low_ms") <= pl.col("median_ms")) & (pl.col("median_ms") <= pl.col("ci_high_ms"))
    assert with_ci.filter(~inside).height == 0

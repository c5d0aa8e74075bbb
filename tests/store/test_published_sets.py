"""The committed result sets under `results/`: what a reader of the published rows relies on.

These are assembled on a workstation from device calls' aggregates (docs/gpu-host.md); a merge
step that repeats or damages rows would otherwise reach the report unnoticed.
"""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from longca.store.aggregate import repeated_rows
from longca.store.schema import conform
from longca.vocab import Status

ROOT = Path(__file__).resolve().parents[2]


def published_sets(readme: Path = ROOT / "results" / "README.md") -> list[str]:
    """The sets the repository publishes: the folders its results/README.md table links, never
    whatever else a user's own runs left under results/."""
    return re.findall(r"^\| \[([A-Za-z0-9_.-]+)\]\(\1/README\.md\)", readme.read_text(), flags=re.M)


def _tables(name: str) -> list[Path]:
    """A published set's row tables: its aggregate and re-runs (a spec-named set), or each spec's
    cell files (a card's set, results/<card>/<spec>/cells/, committed one file per cell)."""
    folder = ROOT / "results" / name
    tables = [p for p in (folder / "all.parquet", folder / "reruns.parquet") if p.is_file()]
    return tables + sorted(p for p in folder.glob("*/cells") if p.is_dir())


SETS = [t for name in published_sets() for t in _tables(name)]


def _read(path: Path):
    if path.is_dir():
        return pq.ParquetDataset(sorted(path.rglob("cell-*.parquet")), partitioning=None).read()
    return pq.read_table(path)


def test_there_are_published_sets() -> None:
    assert any(p.parent.name == "h200" and p.name == "all.parquet" for p in SETS)


def test_only_the_listed_sets_are_published(tmp_path: Path) -> None:
    """A user's own run under results/ is not a published set: the README's table decides."""
    readme = tmp_path / "README.md"
    readme.write_text("| set | spec |\n| --- | --- |\n| [h200](h200/README.md) | x |\n| [h100](h100/README.md) | y |\n")
    assert published_sets(readme) == ["h200", "h100"]
    assert "default" not in published_sets()  # the README's default run writes results/default/


@pytest.mark.parametrize("path", SETS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_a_published_set_holds_each_row_once_with_a_known_status(path: Path) -> None:
    rows = pl.from_arrow(conform(_read(path)))
    assert rows.height > 0
    assert rows.select(pl.col(c).null_count() for c in ("cell_digest", "run_id", "timestamp")).row(0) == (0, 0, 0)
    repeated = repeated_rows(path) if path.is_file() else []
    assert not repeated, f"{path}: rows held more than once: {repeated[:5]}"
    assert set(rows["status"].unique()) <= {s.value for s in Status}


@pytest.mark.parametrize("path", SETS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_every_ok_row_has_a_time_inside_its_interval(path: Path) -> None:
    ok = pl.from_arrow(conform(_read(path))).filter(pl.col("status") == Status.OK.value)
    assert (ok["median_ms"] > 0).all()
    with_ci = ok.filter(pl.col("ci_low_ms").is_not_null())  # rows before schema 4 have none stored
    inside = (pl.col("ci_low_ms") <= pl.col("median_ms")) & (pl.col("median_ms") <= pl.col("ci_high_ms"))
    assert with_ci.filter(~inside).height == 0

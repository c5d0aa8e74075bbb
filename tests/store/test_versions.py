"""Result files of an older schema_version read, aggregate and unpack together with current ones."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longca.report.load import read_rows
from longca.store.aggregate import aggregate, aggregate_arrow, unpack
from longca.store.read import damage
from longca.store.schema import SCHEMA, SCHEMA_VERSION
from longca.store.write import write_rows

NEW_IN_2 = ("check_s", "timer_wall_s", "warmup_s")
ROOT = Path(__file__).resolve().parents[2]


def _row(cell: str, **kw) -> dict:
    row = {"spec": "s", "sweep": "w", "cell_id": cell, "cell_digest": cell, "kernel": "naive", "mask": "full",
           "mask_variant": "default", "pass": "fwd", "seqlen_q": 8, "seqlen_k": 8, "batch": 1, "heads_q": 1,
           "heads_kv": 1, "head_dim": 8, "dtype": "float32", "world_size": 1, "status": "ok", "median_ms": 1.0,
           "samples_ms": [1.0, 1.0], "cell_wall_s": 1.0}
    row.update(kw)
    return row


def _write_v1(path: Path, rows: list[dict]) -> None:
    """A file as schema 1 wrote it: no phase columns, schema_version 1."""
    old = pa.schema([f for f in SCHEMA if f.name not in NEW_IN_2])
    cols = {f.name: pa.array([(1 if f.name == "schema_version" else r.get(f.name)) for r in rows], type=f.type)
            for f in old}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols, schema=old), path)


@pytest.fixture
def mixed(tmp_path: Path) -> list[str]:
    old, new = tmp_path / "cells" / "old.parquet", tmp_path / "cells" / "new.parquet"
    _write_v1(old, [_row("a")])
    write_rows(new, [_row("b", check_s=0.25, timer_wall_s=0.5, warmup_s=0.125)])
    return [str(old), str(new)]


def _by_cell(table: pa.Table) -> dict[str, dict]:
    return {r["cell_id"]: r for r in table.to_pylist()}


@pytest.mark.parametrize("union", [aggregate, aggregate_arrow])
def test_aggregating_old_and_new_files_keeps_both(mixed: list[str], tmp_path: Path, union) -> None:
    assert all(damage(f) is None for f in mixed)  # an old file is sound, not damaged
    out = tmp_path / "all.parquet"
    assert union(mixed, out) == 2
    rows = _by_cell(pq.read_table(out))
    assert rows["a"]["schema_version"] == 1 and rows["b"]["schema_version"] == SCHEMA_VERSION == 2
    assert [rows["a"][c] for c in NEW_IN_2] == [None, None, None]
    assert [rows["b"][c] for c in NEW_IN_2] == [0.25, 0.5, 0.125]


def test_unpacking_a_mixed_aggregate_keeps_each_rows_version(mixed: list[str], tmp_path: Path) -> None:
    out = tmp_path / "all.parquet"
    aggregate(mixed, out)
    assert unpack(out, tmp_path / "results") == (2, 0)
    table, _ = read_rows([tmp_path / "results"])
    rows = _by_cell(table)
    assert (rows["a"]["schema_version"], rows["a"]["check_s"]) == (1, None)
    assert (rows["b"]["schema_version"], rows["b"]["check_s"]) == (2, 0.25)


def test_report_loader_reads_old_and_new_files_together(mixed: list[str]) -> None:
    table, df = read_rows(mixed)
    assert table.schema == SCHEMA
    assert df.sort("cell_id").get_column("timer_wall_s").to_list() == [None, 0.5]


def test_committed_schema_1_results_still_read(tmp_path: Path) -> None:
    committed = ROOT / "results" / "h200" / "all.parquet"
    if not committed.is_file():
        pytest.skip("no committed results")
    old = pq.read_table(committed).slice(0, 20)
    if 1 not in old.column("schema_version").to_pylist():
        pytest.skip("no schema 1 rows among the first committed rows")
    pq.write_table(old, tmp_path / "old.parquet")
    write_rows(tmp_path / "new.parquet", [_row("b", check_s=0.0, timer_wall_s=0.5, warmup_s=0.125)])
    files = [str(tmp_path / "old.parquet"), str(tmp_path / "new.parquet")]
    assert aggregate(files, tmp_path / "all.parquet") == 21
    table, df = read_rows([tmp_path / "all.parquet"])
    assert df.filter(df["schema_version"] == 1).get_column("check_s").null_count() == 20
    assert df.filter(df["schema_version"] == 2).get_column("check_s").to_list() == [0.0]

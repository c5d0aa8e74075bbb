from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longca.report.load import conform, read_rows
from longca.store.schema import SCHEMA


def test_conform_fills_missing_columns_and_drops_unknown() -> None:
    old = pa.table({"kernel": ["k"], "status": ["ok"], "not_in_schema": [1]})
    t = conform(old)
    assert t.schema == SCHEMA
    assert t.column("kernel").to_pylist() == ["k"]
    assert t.column("tflops").to_pylist() == [None]
    assert "not_in_schema" not in t.column_names


def test_reads_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    pq.write_table(pa.table({"kernel": ["x"], "status": ["ok"]}), tmp_path / "a" / "one.parquet")
    pq.write_table(pa.table({"kernel": ["y", "z"], "status": ["oom", "ok"]}), tmp_path / "two.parquet")
    table, df = read_rows([tmp_path / "a", tmp_path / "two.parquet"])
    assert table.num_rows == 3 and df.height == 3
    assert sorted(df.get_column("kernel").to_list()) == ["x", "y", "z"]


def test_missing_input_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_rows([tmp_path / "nope.parquet"])
    with pytest.raises(FileNotFoundError):
        read_rows([tmp_path])  # a directory without Parquet files

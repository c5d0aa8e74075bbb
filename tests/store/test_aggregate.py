"""longca.store.aggregate: the union of cell files, by Polars or, where it cannot, pyarrow alone."""

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_rows import store_row

from longca.store.aggregate import aggregate
from longca.store.schema import SCHEMA
from longca.store.write import write_rows


@pytest.fixture
def shuffled(tmp_path: Path) -> list[str]:
    """Cell files listed in an order unlike the aggregate's (sweep, kernel, mask, length, id, sample)."""
    specs = [("d", "b", "flex", 16, 1), ("c", "b", "flex", 16, 0), ("a", "a", "sdpa", 8, 0), ("e", "a", "flex", 32, 0)]
    files = []
    for i, (cell, sweep, kernel, seqlen, sample) in enumerate(specs):
        f = tmp_path / "cells" / f"{i}.parquet"
        write_rows(
            f,
            [
                store_row(
                    cell,
                    sweep=sweep,
                    kernel=kernel,
                    seqlen_q=seqlen,
                    seqlen_k=seqlen,
                    mask_sample=sample,
                    samples_ms=[1.0, 2.0],
                )
            ],
        )
        files.append(str(f))
    return files


def test_union_is_sorted_and_keeps_the_schema(shuffled: list[str], tmp_path: Path, union) -> None:
    out = tmp_path / "all.parquet"
    assert union(shuffled, out) == 4
    table = pq.read_table(out)
    assert table.column("cell_id").to_pylist() == ["e", "a", "c", "d"]
    assert table.schema.equals(SCHEMA, check_metadata=False)
    assert table.column("samples_ms").to_pylist() == [[1.0, 2.0]] * 4


def test_a_column_outside_the_schema_is_kept_not_dropped(shuffled: list[str], tmp_path: Path) -> None:
    """A file a newer longca wrote (one more column): the pyarrow union keeps it."""
    newer = tmp_path / "cells" / "newer.parquet"
    t = pq.read_table(shuffled[0])
    pq.write_table(t.append_column("from_the_future", pa.array([7.5])), newer)
    out = tmp_path / "all.parquet"
    assert aggregate(shuffled + [str(newer)], out) == 5
    col = pq.read_table(out).column("from_the_future").to_pylist()
    assert sorted(col, key=lambda v: v is None) == [7.5, None, None, None, None]


def test_damaged_file_is_named_and_nothing_written(shuffled: list[str], tmp_path: Path, union) -> None:
    Path(shuffled[2]).write_bytes(b"PAR1 not really")
    out = tmp_path / "all.parquet"
    with pytest.raises(ValueError, match="2.parquet"):
        union(shuffled, out)
    assert not out.exists()


def test_no_files_give_an_empty_table(tmp_path: Path, union) -> None:
    assert union([], tmp_path / "all.parquet") == 0
    assert pq.read_table(tmp_path / "all.parquet").schema.equals(SCHEMA, check_metadata=False)


def test_without_polars_pyarrow_writes_the_same_table(shuffled: list[str], tmp_path: Path, monkeypatch) -> None:
    """The GPU hosts have no Polars: `aggregate` falls back to pyarrow, with the same result."""
    import sys

    aggregate(shuffled, tmp_path / "with.parquet")
    monkeypatch.setitem(sys.modules, "polars", None)  # `import polars` now raises ImportError
    aggregate(list(reversed(shuffled)), tmp_path / "without.parquet")
    assert pq.read_table(tmp_path / "with.parquet").equals(pq.read_table(tmp_path / "without.parquet"))


def test_timestamps_in_another_name_of_the_zone_union_with_the_schemas(shuffled: list[str], tmp_path: Path) -> None:
    """A table DuckDB wrote (`timestamp` in `Etc/UTC`, the schema's is `UTC`) unions with cell files."""
    when = datetime(2026, 12, 5, 19, 27, tzinfo=UTC)
    written = tmp_path / "cells" / "stamped.parquet"
    write_rows(written, [store_row("s", timestamp=when)])
    t = pq.read_table(written)
    i = t.schema.get_field_index("timestamp")
    other = tmp_path / "cells" / "duckdb.parquet"
    pq.write_table(t.set_column(i, "timestamp", t.column(i).cast(pa.timestamp("us", tz="Etc/UTC"))), other)
    out = tmp_path / "all.parquet"
    assert aggregate(shuffled + [str(written), str(other)], out) == 6
    table = pq.read_table(out)
    assert table.schema.field("timestamp").type == SCHEMA.field("timestamp").type
    assert table.column("timestamp").to_pylist().count(when) == 2  # the same instant from both files


def test_repeated_rows_names_each_row_a_table_holds_twice(tmp_path: Path) -> None:
    from datetime import datetime

    from longca.store.aggregate import repeated_rows

    when = datetime(2026, 12, 1, tzinfo=UTC)
    rows = [store_row(c, run_id="r", mask_sample=s, timestamp=when) for c, s in (("a", 0), ("a", 1), ("b", 0))]
    write_rows(tmp_path / "once.parquet", rows)
    assert repeated_rows(tmp_path / "once.parquet") == []
    write_rows(tmp_path / "twice.parquet", rows + rows[1:2])  # a merge that repeated one draw's row
    (repeated,) = repeated_rows(tmp_path / "twice.parquet")
    assert (repeated["cell_digest"], repeated["mask_sample"], repeated["count_all"]) == ("a", 1, 2)

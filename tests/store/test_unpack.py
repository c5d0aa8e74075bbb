"""longca.store.aggregate.unpack: cell files restored from an aggregate, never over sound ones."""

from pathlib import Path

import pyarrow.parquet as pq
from store_rows import store_row

from longca.store.aggregate import aggregate, cell_path_of_row, unpack
from longca.store.write import write_rows


def test_unpack_restores_every_cell_with_all_its_rows_and_keeps_sound_files(tmp_path: Path) -> None:
    cells = [f"c{i:03d}" for i in range(40)]  # more cells than threads
    src = tmp_path / "src"
    files = []
    for i, c in enumerate(cells):
        rows = [store_row(c, mask_sample=s, seqlen_q=8 * (i + 1), median_ms=float(i)) for s in range(1 + i % 3)]
        path = cell_path_of_row(rows[0], src)
        write_rows(path, rows)
        files.append(str(path))
    agg = tmp_path / "all.parquet"
    aggregate(files, agg)

    out = tmp_path / "results"
    assert unpack(agg, out) == (40, 0)
    for i, c in enumerate(cells):
        path = cell_path_of_row(store_row(c, seqlen_q=8 * (i + 1)), out)
        t = pq.read_table(path)
        assert t.num_rows == 1 + i % 3 and set(t.column("median_ms").to_pylist()) == {float(i)}
        # the very table the worker wrote: same rows in the same order, same schema and field docs
        assert t.equals(pq.read_table(files[i]), check_metadata=True)

    # a newer measurement in place is never overwritten; a damaged file is restored
    newer = cell_path_of_row(store_row("c000", seqlen_q=8), out)
    write_rows(newer, [store_row("c000", seqlen_q=8, median_ms=99.0)])
    damaged = cell_path_of_row(store_row("c001", seqlen_q=16), out)
    damaged.write_bytes(damaged.read_bytes()[:50])
    assert unpack(agg, out) == (1, 39)
    assert pq.read_table(newer).column("median_ms").to_pylist() == [99.0]
    assert pq.read_table(damaged).num_rows == 2


def test_keep_rows_outside_appends_only_cells_the_new_table_lacks(tmp_path: Path) -> None:
    from longca.store.aggregate import keep_rows_outside

    def agg(name: str, cells: list[str], **kw) -> Path:
        files = []
        for c in cells:
            path = cell_path_of_row(store_row(c), tmp_path / name)
            write_rows(path, [store_row(c, **kw)])
            files.append(str(path))
        aggregate(files, tmp_path / f"{name}.parquet")
        return tmp_path / f"{name}.parquet"

    old, new = agg("old", ["a", "b", "c"], median_ms=1.0), agg("new", ["b", "c", "d"], median_ms=2.0)
    assert keep_rows_outside(new, old) == 1  # only a: b and c are in the new table
    t = pq.read_table(new).to_pylist()
    assert sorted((r["cell_digest"], r["median_ms"]) for r in t) == [("a", 1.0), ("b", 2.0), ("c", 2.0), ("d", 2.0)]
    assert keep_rows_outside(new, old) == 0  # idempotent: a is in it now
    assert pq.read_table(new).num_rows == 4


def test_unpack_restores_each_cell_where_the_planner_looks_for_it(tmp_path: Path) -> None:
    # The path is built from a row's columns on one side and from the Cell on the other: a key or a
    # value written differently would make a GPU call measure committed cells again.
    from longca.run.rows import cell_columns
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = """
name: t
device: cpu
kernels: [naive]
masks: [causal, {name: sliding_window, window: 8}]
seqlens: [64]
heads: ["4:2"]
head_dims: [16]
dtypes: [float64]
passes: [fwd, bwd]
sweeps:
  - name: dense
  - name: cp
    cp: {mechanisms: [ring_p2p, usp], world_sizes: [2]}
"""
    cells = expand(load_spec(text=spec))
    assert {c.cp_mechanism for c in cells} == {None, "ring_p2p", "usp"}
    files = []
    for c in cells:
        path = tmp_path / "src" / c.relpath()
        write_rows(path, [store_row(c.digest, **cell_columns(c))])
        files.append(str(path))
    aggregate(files, tmp_path / "all.parquet")
    out = tmp_path / "results"
    assert unpack(tmp_path / "all.parquet", out) == (len(cells), 0)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.parquet")) == sorted(
        Path(c.output(out)).relative_to(out).as_posix() for c in cells
    )


def test_move_cells_takes_every_row_of_a_matching_cell_out_of_the_aggregate(tmp_path: Path) -> None:
    """A cell to measure again under its digest leaves the aggregate whole (all its draws, though one
    matched), joins the other table, and is what a plan of the aggregate finds missing."""
    import pytest

    from longca.store.aggregate import move_cells

    files = []
    for c, ms in (("a", [0.5, 30.0]), ("b", [40.0, 50.0]), ("c", [0.2])):
        rows = [store_row(c, mask_sample=s, median_ms=m) for s, m in enumerate(ms)]
        path = cell_path_of_row(rows[0], tmp_path / "cells")
        write_rows(path, rows)
        files.append(str(path))
    src, dst = tmp_path / "all.parquet", tmp_path / "reruns.parquet"
    aggregate(files, src)
    assert move_cells(src, dst, "median_ms < 1 AND cell_digest <> 'c'") == (2, 1, 0)
    assert sorted({r["cell_digest"] for r in pq.read_table(src).to_pylist()}) == ["b", "c"]
    assert sorted((r["cell_digest"], r["median_ms"]) for r in pq.read_table(dst).to_pylist()) == [
        ("a", 0.5),
        ("a", 30.0),
    ]
    assert move_cells(src, dst, "median_ms < 1", current={"b"}) == (0, 0, 1)  # "c" is not current: it stays
    assert move_cells(src, dst, "median_ms < 1") == (1, 1, 0)  # appended to the table already there
    assert pq.read_table(dst).num_rows == 3 and pq.read_table(src).num_rows == 2
    assert move_cells(src, dst, "median_ms < 1") == (0, 0, 0)  # nothing left to move: nothing written
    with pytest.raises(ValueError, match="not a predicate over"):
        move_cells(src, dst, "no_such_column > 1")


def test_move_cells_joins_a_table_whose_timestamps_another_tool_wrote(tmp_path: Path) -> None:
    """The re-run table may hold DuckDB's `Etc/UTC` timestamps (the schema's zone under another name):
    the moved rows join it by the aggregate's union, in the schema's zone."""
    from datetime import UTC, datetime

    import pyarrow as pa
    import pyarrow.compute as pc

    from longca.store.aggregate import move_cells
    from longca.store.schema import SCHEMA

    when = datetime(2026, 12, 5, 21, 48, tzinfo=UTC)
    src, dst = tmp_path / "all.parquet", tmp_path / "reruns.parquet"
    write_rows(src, [store_row("a", timestamp=when), store_row("b", timestamp=when)])
    written = pq.read_table(src)
    old = written.filter(pc.equal(written["cell_digest"], "b"))
    i = old.schema.get_field_index("timestamp")
    pq.write_table(old.set_column(i, "timestamp", old.column(i).cast(pa.timestamp("us", tz="Etc/UTC"))), dst)
    assert move_cells(src, dst, "cell_digest = 'a'") == (1, 1, 0)
    table = pq.read_table(dst)
    assert table.schema.field("timestamp").type == SCHEMA.field("timestamp").type
    assert sorted(table.column("cell_digest").to_pylist()) == ["a", "b"]
    assert table.column("timestamp").to_pylist() == [when, when]

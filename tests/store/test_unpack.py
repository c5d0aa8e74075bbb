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

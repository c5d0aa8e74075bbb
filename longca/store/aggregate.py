"""Aggregate a spec run's cell files into one table with DuckDB."""

from __future__ import annotations

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

_IO_THREADS = min(16, os.cpu_count() or 1)  # Parquet reads, writes and fsync release the GIL


def aggregate(files: list[str], out: str | Path) -> int:
    """Union every cell file (by column name) into one Parquet file, written atomically.

    Only the files of the current plan are read (a list, not a glob), so results of cells that
    left the spec never leak into its report. Returns the row count.
    """
    from longca.store.read import damage

    import duckdb

    bad = [why for f in files if (why := damage(f))]
    if bad:
        raise ValueError("damaged result files (delete them and rerun): " + "; ".join(bad[:10]))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute("SET preserve_insertion_order=false")
    con.execute("CREATE TEMP TABLE f(path VARCHAR)")
    con.executemany("INSERT INTO f VALUES (?)", [(str(p),) for p in files])
    paths = [r[0] for r in con.execute("SELECT path FROM f").fetchall()]
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    os.close(fd)
    try:
        con.execute(
            "COPY (SELECT * FROM read_parquet(?, union_by_name=true, hive_partitioning=false) "
            "ORDER BY sweep, kernel, mask, seqlen_q, cell_id, mask_sample) TO '" + tmp.replace("'", "''") +
            "' (FORMAT parquet, COMPRESSION zstd)", [paths])
        n = con.execute("SELECT count(*) FROM read_parquet(?)", [tmp]).fetchone()[0]
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return int(n)


def aggregate_arrow(files: list[str], out: str | Path) -> int:
    """The same union with pyarrow alone (GPU hosts without DuckDB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from longca.store.write import write_table

    with ThreadPoolExecutor(max_workers=_IO_THREADS) as pool:  # reads release the GIL
        tables = list(pool.map(pq.read_table, files))
    table = pa.concat_tables(tables, promote_options="permissive") if tables else None
    write_table(out, table)
    return table.num_rows


def keep_rows_outside(new_file: str | Path, old_file: str | Path) -> int:
    """Append to `new_file` the rows of `old_file` whose cell digest `new_file` lacks, atomically;
    returns how many. An aggregate holds only its spec's current cells; this keeps an earlier
    aggregate's other rows (cells that left the spec, or cells measured again under a changed
    protocol, whose new digests are in `new_file`) instead of losing them when it is replaced."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from longca.store.write import write_table

    new, old = pq.read_table(new_file), pq.read_table(old_file)
    kept = old.filter(pc.invert(pc.is_in(old["cell_digest"], value_set=new["cell_digest"])))
    if kept.num_rows:  # older rows lack the columns a later schema added: nulls there
        write_table(new_file, pa.concat_tables([new, kept], promote_options="permissive"))
    return kept.num_rows


def cell_path_of_row(row: dict, results_dir: str | Path) -> Path:
    """Where a row's cell file lives: the same hive path the planner gives the cell."""
    keys = ["sweep", "kernel", "mask", "mask_variant", "seqlen_q", "heads_q", "heads_kv", "head_dim", "dtype",
            "pass", "batch"]
    if row.get("cp_mechanism"):
        keys += ["world_size", "cp_mechanism", "cp_variant"]
    parts = "/".join(f"{k}={row[k]}" for k in keys)
    return Path(results_dir) / row["spec"] / "cells" / parts / f"cell-{row['cell_digest']}.parquet"


def unpack(aggregate_file: str | Path, results_dir: str | Path) -> tuple[int, int]:
    """Restore cell files from an aggregate table (results committed or copied from another machine).

    Cells whose file already exists and is sound are left alone, so unpacking never overwrites a
    newer measurement. Returns (cells written, cells kept).
    """
    import pyarrow.parquet as pq

    from longca.store.read import damage
    from longca.store.write import write_rows

    rows = pq.read_table(aggregate_file).to_pylist()
    by_cell: dict[Path, list[dict]] = {}
    for row in rows:
        by_cell.setdefault(cell_path_of_row(row, results_dir), []).append(row)

    def restore(item: tuple[Path, list[dict]]) -> bool:
        path, cell_rows = item
        if path.exists() and damage(path) is None:
            return False
        write_rows(path, cell_rows)
        return True

    # Threads: Parquet encoding and fsync release the GIL, and a GPU call restores thousands of
    # cells before it runs any (76 s on one core for the 4136 cells of results/h200/all.parquet).
    with ThreadPoolExecutor(max_workers=_IO_THREADS) as pool:
        restored = list(pool.map(restore, by_cell.items()))
    written = sum(restored)
    return written, len(restored) - written

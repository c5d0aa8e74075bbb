"""Aggregate a spec run's cell files into one table with DuckDB."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import duckdb


def aggregate(files: list[str], out: str | Path) -> int:
    """Union every cell file (by column name) into one Parquet file, written atomically.

    Only the files of the current plan are read (a list, not a glob), so results of cells that
    left the spec never leak into its report. Returns the row count.
    """
    from longca.store.read import damage

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

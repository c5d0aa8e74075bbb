"""Aggregate a spec run's cell files into one table (Polars; pyarrow alone where Polars is absent)."""

from __future__ import annotations

import os
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

from longca.spec.cells import CP_PARTITION_KEYS, cell_relpath

_IO_THREADS = min(16, os.cpu_count() or 1)  # Parquet reads, writes and fsync release the GIL
_ORDER = ["sweep", "kernel", "mask", "seqlen_q", "cell_id", "mask_sample"]  # the aggregate's row order


def aggregate(files: list[str], out: str | Path) -> int:
    """Union every cell file (by column name) into one Parquet file, sorted, written atomically.

    Only the files of the current plan are read (a list, not a glob), so results of cells that
    left the spec never leak into its report. Returns the row count.

    Polars reads the files against the package's result schema (columns an older schema version
    lacks come back null): 4 s for 3829 cell files on two cores, where DuckDB's union by name took
    12 s and pyarrow 28 s. Where Polars is absent (the GPU hosts), or a file has a column outside
    the schema (written by a newer longca) or of another type, pyarrow unions the files instead,
    keeping every column and promoting types.
    """
    _check_sound(files)
    try:
        table = _union_polars(files)
    except (ImportError, _OutsideSchema):
        table = _union_arrow(files)
    from longca.store.write import PUBLISHED_ZSTD_LEVEL, write_table

    write_table(out, table, level=PUBLISHED_ZSTD_LEVEL)
    return table.num_rows


def _check_sound(files: list[str]) -> None:
    from longca.store.read import damage

    with ThreadPoolExecutor(max_workers=_IO_THREADS) as pool:  # footer reads release the GIL
        bad = [why for why in pool.map(damage, files) if why]
    if bad:
        raise ValueError("damaged result files (delete them and rerun): " + "; ".join(bad[:10]))


class _OutsideSchema(Exception):
    pass


def _union_polars(files: list[str]):
    import polars as pl

    from longca.store.schema import SCHEMA

    if not files:
        return SCHEMA.empty_table()
    schema = pl.from_arrow(SCHEMA.empty_table()).schema
    try:
        df = pl.scan_parquet(files, schema=schema, missing_columns="insert", extra_columns="raise").collect()
    except pl.exceptions.SchemaError as exc:
        raise _OutsideSchema(str(exc)) from exc
    df = df.sort(_ORDER, nulls_last=True, maintain_order=True)
    return df.to_arrow().cast(SCHEMA)  # polars' string views back to the schema's types and docs


def _union_arrow(files: list[str]):
    import pyarrow.parquet as pq

    from longca.store.schema import SCHEMA

    if not files:
        return SCHEMA.empty_table()
    # ParquetFile.read, not pq.read_table: the latter builds a dataset per file (twice the time)
    with ThreadPoolExecutor(max_workers=_IO_THREADS) as pool:  # reads release the GIL
        return _union_tables(list(pool.map(lambda f: pq.ParquetFile(f).read(), files)))


def _union_tables(tables: list):
    """The tables as one, by column name, in the aggregate's row order: the schema's time zone on
    its timestamp columns, and its column order and types where every column is the schema's."""
    import pyarrow as pa

    from longca.store.schema import SCHEMA, conform

    table = pa.concat_tables([_schema_zones(t) for t in tables], promote_options="permissive")
    if set(table.column_names) <= set(SCHEMA.names):  # the schema's column order and types, as Polars gives
        table = conform(table)
    return table.sort_by([(c, "ascending") for c in _ORDER if c in table.column_names])


def _schema_zones(table):
    """`table` with each timestamp column of the schema's in the schema's time zone: a file written
    by another tool (DuckDB writes `Etc/UTC` for `UTC`) holds the same instants under another name,
    which neither Polars nor pyarrow unions with the schema's."""
    import pyarrow as pa

    from longca.store.schema import SCHEMA

    for i, field in enumerate(table.schema):
        want = SCHEMA.field(field.name).type if field.name in SCHEMA.names else None
        if (
            want is not None
            and pa.types.is_timestamp(field.type)
            and pa.types.is_timestamp(want)
            and field.type != want
        ):
            table = table.set_column(i, field.name, table.column(i).cast(want))
    return table


def keep_rows_outside(new_file: str | Path, old_file: str | Path) -> int:
    """Append to `new_file` the rows of `old_file` whose cell digest `new_file` lacks, atomically;
    returns how many. An aggregate holds only its spec's current cells; this keeps an earlier
    aggregate's other rows (cells that left the spec, or cells measured again under a changed
    protocol, whose new digests are in `new_file`) instead of losing them when it is replaced."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from longca.store.write import PUBLISHED_ZSTD_LEVEL, write_table

    new, old = pq.read_table(new_file), pq.read_table(old_file)
    kept = old.filter(pc.invert(pc.is_in(old["cell_digest"], value_set=new["cell_digest"])))
    if kept.num_rows:  # older rows lack the columns a later schema added: nulls there
        write_table(new_file, _union_tables([new, kept]), level=PUBLISHED_ZSTD_LEVEL)
    return kept.num_rows


class Moved(NamedTuple):
    """What move_cells did: rows and cells moved, and matching cells left because not current."""

    rows: int
    cells: int
    not_current: int


def move_cells(src: str | Path, dst: str | Path, where: str, current: Collection[str] | None = None) -> Moved:
    """Move every row of the cells (digests) of which a row of `src` matches the SQL predicate
    `where` (DuckDB, over `src`'s columns) from `src` to `dst` (created if absent), each written
    atomically; returns what moved (Moved). For a published cell that must be measured again under
    the same digest (a row that records a limit the code no longer has): once out of the aggregate
    it is missing, so the next run measures it, and its earlier rows stay in `dst` (a re-run table:
    the two runs of one digest are a pair for the move between runs).

    `current`: the digests of the spec's cells. A matching cell outside them (a superseded digest)
    stays: no run would measure it again, so moving it would only drop its rows from the published
    set; `not_current` counts such cells."""
    import duckdb
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from longca.store.write import PUBLISHED_ZSTD_LEVEL, write_table

    table = pq.read_table(src)
    con = duckdb.connect()
    con.register("src", table)
    try:
        digests = [d for (d,) in con.execute(f"SELECT DISTINCT cell_digest FROM src WHERE {where}").fetchall() if d]
    except duckdb.Error as exc:
        raise ValueError(f"where {where!r}: not a predicate over {src}'s columns ({exc})") from None
    stale = set() if current is None else set(digests) - set(current)
    digests = [d for d in digests if d not in stale]
    chosen = pc.is_in(table["cell_digest"], value_set=pa.array(digests, pa.string()))
    moved = table.filter(chosen)
    if not moved.num_rows:
        return Moved(0, 0, len(stale))
    parts = ([pq.read_table(dst)] if Path(dst).exists() else []) + [moved]
    write_table(dst, _union_tables(parts), level=PUBLISHED_ZSTD_LEVEL)  # the aggregate's union: time zones
    write_table(src, table.filter(pc.invert(chosen)), level=PUBLISHED_ZSTD_LEVEL)
    return Moved(moved.num_rows, len(digests), len(stale))


# One measurement of one draw of one cell: a second row with these values is the same row twice.
ROW_IDENTITY = ("cell_digest", "run_id", "mask_sample", "timestamp")


def repeated_rows(file: str | Path) -> list[dict]:
    """The row identities (ROW_IDENTITY) that `file` holds more than once, each with its count: what
    a merge of aggregates must never produce."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from longca.store.schema import conform

    ids = conform(pq.read_table(file)).select(list(ROW_IDENTITY))
    counts = ids.group_by(list(ROW_IDENTITY)).aggregate([([], "count_all")])
    return counts.filter(pc.greater(counts["count_all"], 1)).to_pylist()


def cell_path_of_row(row: dict, results_dir: str | Path) -> Path:
    """Where a row's cell file lives: the same hive path the planner gives the cell."""
    return Path(results_dir) / row["spec"] / "cells" / cell_relpath(row, row["cell_digest"])


def unpack(aggregate_file: str | Path, results_dir: str | Path) -> tuple[int, int]:
    """Restore cell files from an aggregate table (results committed or copied from another machine).

    Cells whose file already exists and is sound are left alone, so unpacking never overwrites a
    newer measurement. Returns (cells written, cells kept).
    """
    import pyarrow.parquet as pq

    from longca.store.read import damage
    from longca.store.schema import conform
    from longca.store.write import write_table

    table = conform(pq.read_table(aggregate_file))
    keys = table.select(["spec", "cell_digest", *CP_PARTITION_KEYS]).to_pylist()
    by_cell: dict[Path, list[int]] = {}
    for i, row in enumerate(keys):
        by_cell.setdefault(cell_path_of_row(row, results_dir), []).append(i)

    def restore(item: tuple[Path, list[int]]) -> bool:
        path, rows = item
        if path.exists() and damage(path) is None:
            return False
        write_table(path, table.take(rows))  # the cell's rows as Arrow slices: no Python row objects
        return True

    # Threads: Parquet encoding and fsync release the GIL, and a GPU call restores thousands of
    # cells before it runs any. Taking each cell's rows from the Arrow table, not rebuilding them
    # from Python dicts, leaves little under the GIL: 18 -> 12 ms per cell on one core.
    with ThreadPoolExecutor(max_workers=_IO_THREADS) as pool:
        restored = list(pool.map(restore, by_cell.items()))
    written = sum(restored)
    return written, len(restored) - written

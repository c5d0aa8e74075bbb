"""Read one or more result Parquet files into one table with exactly the current SCHEMA.

Older files (an earlier schema_version) lack columns added since; they are filled with nulls so
every query downstream can name any column. A column the schema does not know is dropped: the
report draws only what the contract defines.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from longca.store.schema import conform


def read_tables(paths: Sequence[str | Path]) -> pa.Table:
    """All rows of all files (a directory means every *.parquet below it), conformed and concatenated."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.rglob("*.parquet")))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"no such result file: {p}")
    if not files:
        raise FileNotFoundError(f"no Parquet files in {', '.join(map(str, paths))}")
    return pa.concat_tables([conform(pq.read_table(f)) for f in files])


def read_rows(paths: Sequence[str | Path]) -> tuple[pa.Table, pl.DataFrame]:
    """The conformed Arrow table (for downloads) and the same rows as a Polars frame (for queries)."""
    table = read_tables(paths)
    return table, pl.from_arrow(table)

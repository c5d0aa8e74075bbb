"""Atomic Parquet writes: a temporary file in the same folder, fsync, then rename.

A killed process leaves either the old file, the new file, or a stray temporary (ignored by every
reader, since it does not end in .parquet): never a half-written result.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from longca.store.schema import to_table


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> None:
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    write_table(path, to_table(clean))


def write_table(path: str | Path, table: pa.Table) -> None:
    """`table` to `path` atomically (cell files and aggregates alike)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            pq.write_table(table, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise

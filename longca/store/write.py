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

# zstd level of files that are published and read many times (aggregates, report downloads): the
# per-iteration samples are most of their bytes, and level 19 keeps 8-11% fewer than the default
# (3) for seconds of one core per aggregate.
PUBLISHED_ZSTD_LEVEL = 19
# Cell files are committed one per measured cell, so git stores them: uncompressed pages without
# dictionaries, statistics or the Arrow schema (the types read back the same) leave git's own
# compression and deltas between cells to work. 300 one-row dense cells took 776 KB of packed git
# objects so, 1000-1600 KB as zstd Parquet files, against 520 KB for the same rows as one zstd-19
# aggregate.
CELL_FILE_OPTIONS = {"compression": "none", "use_dictionary": False, "write_statistics": False, "store_schema": False}


def _process_umask() -> int:
    """The process's umask (read once: os.umask can only be read by setting it, which is not safe
    while other threads create files)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# mkstemp creates its files 0600; a result is made readable as any new file would be (0644 under
# umask 0022), so colleagues on a shared file system can read it
_FILE_MODE = 0o666 & ~_process_umask()


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> None:
    clean = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    write_table(path, to_table(clean))


def write_table(path: str | Path, table: pa.Table, level: int | None = None) -> None:
    """`table` to `path` atomically: an aggregate zstd-compressed at `level`, a cell file (no
    `level`) in the form git stores best (CELL_FILE_OPTIONS)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if level is None:
                pq.write_table(table, fh, **CELL_FILE_OPTIONS)
            else:
                pq.write_table(table, fh, compression="zstd", compression_level=level)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise

"""Reading results back, and telling a sound result file from a damaged one."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from longca.store.schema import REQUIRED


def damage(path: str | Path) -> str | None:
    """Why a cell file cannot be trusted (truncated, corrupt, wrong schema, empty), or None if sound.

    Checks the Parquet magic at both ends and parses the footer: cheap (no data pages read), so
    the planner can check thousands of files before every run.
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if size < 12:
            return f"{p}: truncated ({size} bytes)"
        with open(p, "rb") as fh:
            head = fh.read(4)
            fh.seek(-4, 2)
            tail = fh.read(4)
        if head != b"PAR1" or tail != b"PAR1":
            return f"{p}: not a complete Parquet file (bad magic bytes; truncated or overwritten)"
        meta = pq.read_metadata(p)
    except FileNotFoundError:
        return f"{p}: missing"
    except Exception as exc:  # noqa: BLE001 - any parse failure means damaged
        return f"{p}: unreadable Parquet ({type(exc).__name__}: {exc})"
    if meta.num_rows < 1:
        return f"{p}: holds no rows"
    names = set(meta.schema.names)
    missing = [c for c in REQUIRED if c not in names]
    if missing:
        return f"{p}: missing columns {missing}"
    return None


def digest_statuses(path: str | Path) -> tuple[list[str | None], list[str | None] | None]:
    """Every row's cell_digest and status of a result table, reading those two columns only (the
    statuses are None where the table has no status column). Raises KeyError without a cell_digest
    column."""
    names = pq.read_schema(path).names
    if "cell_digest" not in names:
        raise KeyError(f"{path}: no cell_digest column")
    table = pq.read_table(path, columns=[c for c in ("cell_digest", "status") if c in names])
    statuses = table.column("status").to_pylist() if "status" in names else None
    return table.column("cell_digest").to_pylist(), statuses


def run_summary(aggregate: str | Path, report: str | Path | None = None) -> str:
    """One line for the end of a run: the aggregate's cells by status and where the report is."""
    import pyarrow.compute as pc

    table = pq.read_table(aggregate, columns=["cell_digest", "status"])
    per_cell = table.group_by(["cell_digest"]).aggregate([("status", "min")])
    counts = pc.value_counts(per_cell["status_min"]).to_pylist()
    text = ", ".join(f"{c['counts']} {c['values']}" for c in sorted(counts, key=lambda c: -c["counts"]))
    line = f"longca: {per_cell.num_rows} cells ({text}), {table.num_rows} rows in {aggregate}"
    return line + (f"; report: {report}" if report else "")

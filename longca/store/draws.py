"""Finished mask draws of a cell that is not finished yet, each in a file of its own beside the cell
file, so that a stopped run keeps the draws it measured and the next run measures only the rest.

A cell of a sampled mask has one row per draw, and its cell file is written once, when every draw is
measured (longca.store.write: never half a cell). At 512K one draw can take minutes, and a cell of
three draws can outlast a whole device call; without these files a run stopped inside the cell
would lose every draw it finished. A draw file is named for the cell's digest and the draw
(`cell-<digest>.draw-<k>.partial`), so a changed protocol (a new digest) never reuses one, and it
does not end in `.parquet`, so no reader of results takes it for a cell. The worker removes a
cell's draw files once the cell file is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from longca.store.write import write_rows

SUFFIX = ".partial"


def draw_file(cell_file: str | Path, sample: int) -> Path:
    """Where draw `sample` of the cell whose file is `cell_file` (cell-<digest>.parquet) is kept."""
    p = Path(cell_file)
    return p.with_name(f"{p.stem}.draw-{sample}{SUFFIX}")


def save_draw(cell_file: str | Path, sample: int, row: dict[str, Any]) -> None:
    """Keep one finished draw's row (atomically, like a cell file)."""
    write_rows(draw_file(cell_file, sample), [row])


def load_draw(cell_file: str | Path, sample: int) -> dict[str, Any] | None:
    """The row of draw `sample` kept by an earlier run, or None (none kept, or not readable)."""
    p = draw_file(cell_file, sample)
    if not p.is_file():
        return None
    try:
        rows = pq.read_table(p).to_pylist()
    except Exception:  # noqa: BLE001 - a damaged draw file is measured again, never trusted
        return None
    return rows[0] if len(rows) == 1 and rows[0].get("status") == "ok" else None


def all_kept(cell: Any, cell_file: str | Path) -> bool:
    """Whether every draw of a sampled cell (`cell.samples` > 1) is kept beside its file."""
    return cell.samples > 1 and all(draw_file(cell_file, k).is_file() for k in range(cell.samples))


def clear_draws(cell_file: str | Path) -> None:
    """Remove the draw files of a cell whose cell file is written."""
    p = Path(cell_file)
    for f in p.parent.glob(f"{p.stem}.draw-*{SUFFIX}"):
        f.unlink(missing_ok=True)


def kept_draws(results_dir: str | Path, spec_name: str) -> dict[str, int]:
    """Per cell digest, how many finished draws are kept for it under `results_dir`/`spec_name`."""
    import collections

    counts: collections.Counter[str] = collections.Counter()
    for f in (Path(results_dir) / spec_name / "cells").rglob(f"cell-*.draw-*{SUFFIX}"):
        counts[f.name[len("cell-") : f.name.index(".draw-")]] += 1
    return dict(counts)

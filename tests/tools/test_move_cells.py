"""tools/move_cells.py: the command line of longca.store.aggregate.move_cells (tests/store/test_unpack.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "move_cells.py"), *args], capture_output=True, text=True
    )


def test_it_says_what_it_moved_and_names_a_bad_predicate(tmp_path: Path) -> None:
    src, dst = tmp_path / "all.parquet", tmp_path / "reruns.parquet"
    pq.write_table(pa.table({"cell_digest": ["a", "a", "b"], "median_ms": [0.5, 30.0, 2.0]}), src)
    done = _run(str(src), str(dst), "--where", "median_ms < 1")
    assert done.returncode == 0 and done.stdout.strip() == f"moved 2 rows of 1 cells from {src} to {dst}"
    assert pq.read_table(src).column("cell_digest").to_pylist() == ["b"]
    bad = _run(str(src), str(dst), "--where", "median < 1")
    assert bad.returncode == 2 and bad.stderr.startswith("move_cells: where 'median < 1': not a predicate over")

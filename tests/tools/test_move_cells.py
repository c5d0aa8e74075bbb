"""tools/move_cells.py: the command line of longca.store.aggregate.move_cells (tests/store/test_unpack.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from longca.spec.cells import expand
from longca.spec.load import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "default.yaml"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "move_cells.py"), *args], capture_output=True, text=True
    )


def test_it_moves_current_cells_leaves_superseded_ones_and_names_a_bad_predicate(tmp_path: Path) -> None:
    """Of the matching cells, the spec's current ones move (every row) and a superseded digest stays,
    as the output says: no run of the spec would measure it again. --any-digest moves any (an undo)."""
    a, b = (c.digest for c in expand(load_spec(SPEC))[:2])
    old = "0123456789abcdef"  # a digest no cell of the spec has
    src, dst = tmp_path / "all.parquet", tmp_path / "reruns.parquet"
    pq.write_table(pa.table({"cell_digest": [a, a, b, old], "median_ms": [0.5, 30.0, 2.0, 0.1]}), src)
    done = _run(str(SPEC), str(src), str(dst), "--where", "median_ms < 1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"moved 2 rows of 1 cells from {src} to {dst}",
        f"left 1 matching cells that are not cells of {SPEC} (superseded digests)",
    ]
    assert sorted(pq.read_table(src).column("cell_digest").to_pylist()) == sorted([b, old])
    assert pq.read_table(dst).column("cell_digest").to_pylist() == [a, a]
    back = _run(str(SPEC), str(dst), str(src), "--where", "cell_digest IS NOT NULL", "--any-digest")
    assert back.returncode == 0 and back.stdout.strip() == f"moved 2 rows of 1 cells from {dst} to {src}"
    old_back = _run(str(SPEC), str(src), str(dst), "--where", f"cell_digest = '{old}'", "--any-digest")
    assert old_back.stdout.strip() == f"moved 1 rows of 1 cells from {src} to {dst}"  # an undo moves any digest
    bad = _run(str(SPEC), str(src), str(dst), "--where", "median < 1")
    assert bad.returncode == 2 and bad.stderr.startswith("move_cells: where 'median < 1': not a predicate over")
    no_spec = _run(str(tmp_path / "none.yaml"), str(src), str(dst), "--where", "median_ms < 1")
    assert no_spec.returncode == 2 and no_spec.stderr.startswith("move_cells:") and "none.yaml" in no_spec.stderr

"""tools/sweep_efficiency.py: a sweep's timed samples over the walls of the processes that ran it."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import polars as pl
import pytest

from longca.spec.cells import expand
from longca.spec.load import load_spec

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sweep_efficiency", ROOT / "tools" / "sweep_efficiency.py")
se = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(se)

SPEC = """\
name: tiny
device: cpu
repeat: {warmup: 1, iters: 3, min_iters: 1, budget_s: 0.5, l2_flush: false}
heads: ["2:2"]
head_dims: [16]
dtypes: [float32]
passes: [fwd]
sweeps:
  - name: dense
    kernels: [naive]
    masks: [full, causal]
    seqlens: [128]
  - name: dense_baselines
    kernels: [naive]
    masks: [full]
    seqlens: [128]
"""


def test_process_walls_match_the_sweep_argument_exactly() -> None:
    lines = [
        "process wall 10.5 s: --spec specs/h200.yaml --sweep dense --shard 0/2",
        "process wall 3.0 s: --spec specs/h200.yaml --sweep dense_baselines",  # another sweep
        "[longca] chunk done: 3 cells in 9.0 s",
        "  process wall 2.0 s: --sweep dense --only kernel=fa4",
    ]
    assert se.process_walls(lines, "dense") == [10.5, 2.0]
    assert se.process_walls(lines, "dense_baselines") == [3.0]
    assert se.process_walls(lines, "long") == []


def test_read_lines_reads_plain_and_gzipped_logs_in_folders(tmp_path: Path) -> None:
    (tmp_path / "call1").mkdir()
    (tmp_path / "call1" / "dense-0.log").write_text("process wall 1.0 s: --sweep dense\n")
    with gzip.open(tmp_path / "call1" / "old.log.gz", "wt") as fh:
        fh.write("process wall 2.0 s: --sweep dense\n")
    (tmp_path / "call1" / "env.txt").write_text("process wall 99.0 s: --sweep dense\n")  # not a log
    assert sorted(se.process_walls(se.read_lines([tmp_path]), "dense")) == [1.0, 2.0]


def test_main_counts_only_the_current_cells_of_the_sweep(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "tiny.yaml").write_text(SPEC)
    cells = [c for c in expand(load_spec(tmp_path / "tiny.yaml")) if c.sweep == "dense"]
    assert len(cells) == 2
    rows = pl.DataFrame(
        {
            "cell_digest": [cells[0].digest, cells[0].digest, "superseded0", "baselines1"],
            "samples_ms": [[1000.0, 500.0], [1500.0], [9000.0], [7000.0]],  # 3 s of the current cell's samples
        }
    )
    rows.write_parquet(tmp_path / "all.parquet")
    (tmp_path / "run.log").write_text(
        "process wall 4.0 s: --spec tiny.yaml --sweep dense\n"
        "process wall 2.0 s: --spec tiny.yaml --sweep dense\n"
        "process wall 50.0 s: --spec tiny.yaml --sweep dense_baselines\n"
    )
    assert (
        se.main(
            [
                "--spec",
                str(tmp_path / "tiny.yaml"),
                "--sweep",
                "dense",
                "--rows",
                str(tmp_path / "all.parquet"),
                "--logs",
                str(tmp_path / "run.log"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "1 of 2 cells have rows" in out and "2 processes, 6.0 s of process wall; 3.0 s timed" in out
    assert "timed / process wall = 0.500" in out and "1 cells still missing" in out


def test_main_names_the_allowed_sweeps(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "tiny.yaml").write_text(SPEC)
    with pytest.raises(SystemExit):
        se.main(["--spec", str(tmp_path / "tiny.yaml"), "--sweep", "dens", "--rows", "x", "--logs", "y"])
    assert "allowed: dense, dense_baselines" in capsys.readouterr().err

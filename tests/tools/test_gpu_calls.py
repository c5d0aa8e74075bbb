"""tools/gpu-calls.sh, run on the CPU over a small work tree: a series of calls carries only its
selection's rows, each call's caches and kept draws reach the next, and the end merges every call's
rows into the published set once, with the published tree back in place."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from longca.run.rows import status_row
from longca.run.serving import planned_unsupported
from longca.spec.cells import expand
from longca.spec.load import load_spec
from longca.store.write import write_rows

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "default.yaml"
CELLS = [c for c in expand(load_spec(SPEC)) if c.sweep == "dense" and not planned_unsupported(c)]
AT_256 = [c for c in CELLS if c.seqlen == 256][:3]  # the selection's cells: 3 at 256
AT_512 = [c for c in CELLS if c.seqlen == 512][:2]  # published cells outside the selection


def _rows(cells, run: str, minute: int) -> list[dict]:
    when = datetime(2026, 12, 1, 12, minute, tzinfo=UTC)
    return [
        status_row(c, "ok", None, median_ms=1.0, samples_ms=[1.0, 1.0], mask_sample=0, run_id=run, timestamp=when)
        for c in cells
    ]


def _sh(work: Path, published: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "LONGCA_PUBLISHED": str(published),
    }
    return subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu-calls.sh"), *args], cwd=work, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def _digests(path: Path) -> list[str]:
    return sorted(r[0] for r in duckdb.execute("SELECT cell_digest FROM read_parquet(?)", [str(path)]).fetchall())


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A work tree whose published set holds one selected cell, two cells outside the selection and
    a row of an earlier digest, and a report."""
    work = tmp_path / "tree"
    agg = work / "results" / "default" / "all.parquet"
    earlier = {**_rows([AT_256[1]], "old", 0)[0], "cell_digest": "0123456789abcdef"}
    write_rows(agg, _rows([AT_256[0], *AT_512], "pub", 1) + [earlier])
    (work / "reports" / "default").mkdir(parents=True)
    (work / "reports" / "default" / "index.html").write_text("<p>published</p>")
    return work


def _call(tmp_path: Path, name: str, carried: Path, cells, run: str, minute: int, draws: bool) -> Path:
    """A call's OUTDIR: what it carried plus its own rows, FA4's cache, and kept draws if any."""
    out = tmp_path / name
    out.mkdir()
    shutil.copy(carried, out / "carried.parquet")
    rows = pq.read_table(carried).to_pylist() + _rows(cells, run, minute)
    write_rows(out / "default.parquet", rows)
    (out / "fa4-cache.tar.xz").write_bytes(name.encode())
    if draws:
        (out / "draws.tar.gz").write_bytes(name.encode())
    return out


def test_a_series_of_calls_carries_its_selection_and_merges_once(tree: Path, tmp_path: Path) -> None:
    published = tmp_path / "published"
    selection = ("--sweep", "dense", "--only", "seqlen=256")
    done = _sh(tree, published, "start", str(SPEC), *selection)
    assert done.returncode == 0, done.stderr
    carried = tree / "results" / "default" / "all.parquet"
    # the first call carries the published rows of its selection's current cells only
    assert _digests(carried) == [AT_256[0].digest]
    assert not (tree / "reports").exists() and (published / "reports" / "default" / "index.html").is_file()
    # each cell left of the published set with its projected seconds, for the calls' --time-left
    estimates = dict(zip(*pq.read_table(tree / "results" / "default" / "estimates.parquet").to_pydict().values()))
    assert AT_256[2].digest in estimates and all(s > 0 for s in estimates.values())
    assert not {c.digest for c in (AT_256[0], *AT_512)} & set(estimates)  # published: not left

    call1 = _call(tmp_path, "call1", carried, [AT_256[1]], "c1", 10, draws=True)
    (tree / ".draws").mkdir()
    (tree / ".draws" / "draws.tar.gz").write_bytes(b"stale")
    done = _sh(tree, published, "next", str(SPEC), str(call1), *selection)
    assert done.returncode == 0, done.stderr
    assert (tree / ".fa4-cache" / "fa4-cache.tar.xz").read_bytes() == b"call1"
    assert (tree / ".draws" / "draws.tar.gz").read_bytes() == b"call1"  # the call's kept draws replace the old
    assert _digests(carried) == sorted([AT_256[0].digest, AT_256[1].digest])

    call2 = _call(tmp_path, "call2", carried, [AT_256[2]], "c2", 20, draws=False)
    done = _sh(tree, published, "next", str(SPEC), str(call2), *selection)
    assert done.returncode == 0, done.stderr
    assert not (tree / ".draws" / "draws.tar.gz").exists()  # nothing left unfinished

    done = _sh(tree, published, "finish", str(SPEC), str(call1), str(call2))
    assert done.returncode == 0, done.stderr
    agg = tree / "results" / "default" / "all.parquet"
    # every published row (the earlier digest's and the cells outside the selection) and each
    # call's row, once
    want = sorted([c.digest for c in (*AT_256, *AT_512)] + ["0123456789abcdef"])
    assert _digests(agg) == want
    assert (tree / "reports" / "default" / "index.html").read_text() == "<p>published</p>"
    assert not published.exists()
    assert not (tree / "results" / "default" / "estimates.parquet").exists()  # the calls' only


def test_finish_puts_back_the_moved_cells_no_call_measured(tree: Path, tmp_path: Path) -> None:
    """Cells moved to the re-run table before the calls (tools/move_cells.py) are missing from the
    published set until measured again: those the calls did not reach go back with their rows;
    re-run pairs of published cells and rows of earlier digests stay in the re-run table."""
    published = tmp_path / "published"
    reruns = tree / "results" / "default" / "reruns.parquet"
    old = {**_rows([AT_512[1]], "old", 2)[0], "cell_digest": "fedcba9876543210"}
    write_rows(reruns, _rows([AT_256[1], AT_256[2]], "moved", 3) + _rows([AT_512[0]], "rerun", 4) + [old])
    selection = ("--only", "seqlen=256")
    assert _sh(tree, published, "start", str(SPEC), *selection).returncode == 0
    carried = tree / "results" / "default" / "all.parquet"
    call = _call(tmp_path, "call", carried, [AT_256[1]], "c1", 10, draws=False)  # AT_256[2] not reached
    done = _sh(tree, published, "finish", str(SPEC), str(call))
    assert done.returncode == 0, done.stderr
    assert "1 moved cells no call measured again" in done.stdout
    agg = tree / "results" / "default" / "all.parquet"
    assert _digests(agg) == sorted([c.digest for c in (*AT_256, *AT_512)] + ["0123456789abcdef"])
    runs = dict(duckdb.execute("SELECT cell_digest, run_id FROM read_parquet(?)", [str(agg)]).fetchall())
    assert runs[AT_256[1].digest] == "c1" and runs[AT_256[2].digest] == "moved"  # measured; back as published
    assert _digests(reruns) == sorted([AT_256[1].digest, AT_512[0].digest, "fedcba9876543210"])


def test_finish_writes_nothing_when_a_row_would_be_there_twice(tree: Path, tmp_path: Path) -> None:
    published = tmp_path / "published"
    assert _sh(tree, published, "start", str(SPEC), "--only", "seqlen=256").returncode == 0
    carried = tree / "results" / "default" / "all.parquet"
    call = _call(tmp_path, "call", carried, [AT_256[1]], "c1", 10, draws=False)
    rows = pq.read_table(call / "default.parquet").to_pylist()
    write_rows(call / "default.parquet", rows + rows[-1:])  # the same row twice
    done = _sh(tree, published, "finish", str(SPEC), str(call))
    assert done.returncode != 0 and "twice" in done.stderr
    # the published set stays where it was, whole
    assert (published / "results" / "default" / "all.parquet").is_file()
    assert len(_digests(published / "results" / "default" / "all.parquet")) == 4


def test_start_refuses_over_an_unfinished_series(tree: Path, tmp_path: Path) -> None:
    published = tmp_path / "published"
    (published / "results").mkdir(parents=True)
    done = _sh(tree, published, "start", str(SPEC))
    assert done.returncode == 2 and "already holds a published set" in done.stderr
    assert (tree / "results" / "default" / "all.parquet").is_file()

"""The real Snakemake on a tiny spec: full run, incremental reruns, kill and resume, damaged files."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from wf import jobs_run, snakemake

TINY = """
name: tiny
device: cpu
repeat: {{warmup: 0, iters: 2, min_iters: 1, budget_s: 0.05, l2_flush: false}}
check: {{max_seqlen: 128}}
mask_samples: {{multi_document: 2, single: 1}}
chunk_size: {chunk}
kernels: [naive, sdpa_math, sdpa_flash]
masks: [full, causal, causal_document]
seqlens: {seqlens}
heads: ["2:1"]
head_dims: [16]
dtypes: [float32]
passes: [fwd, bwd]
sweeps: [{{name: dense}}]
"""


def write_spec(workdir: Path, seqlens="[64, 128]", chunk=100) -> str:
    (workdir / "specs" / "tiny.yaml").write_text(TINY.format(seqlens=seqlens, chunk=chunk))
    return "specs/tiny.yaml"


def cell_files(workdir: Path) -> list[Path]:
    return sorted((workdir / "results" / "tiny" / "cells").rglob("*.parquet"))


def test_full_then_incremental(workdir):
    spec = write_spec(workdir)
    proc = snakemake(workdir, spec)
    files = cell_files(workdir)
    assert len(files) == 3 * 3 * 2 * 2  # kernels x masks x seqlens x passes
    agg = workdir / "results" / "tiny" / "all.parquet"
    statuses = dict(duckdb.sql(f"SELECT status, count(DISTINCT cell_id) FROM '{agg}' GROUP BY 1").fetchall())
    assert statuses == {"ok": 32, "unsupported": 4}  # sdpa_flash takes no document mask
    assert (workdir / "reports" / "tiny" / "index.html").exists()
    assert set(jobs_run(proc)) >= {"aggregate", "report", "all"}
    # the run ends with what it gave and where the report is
    summary = (
        r"longca: 36 cells \(32 ok, 4 unsupported\), 44 rows in results/tiny/all.parquet; report: reports/tiny/index"
    )
    assert re.search(summary, proc.stdout + proc.stderr), proc.stderr[-2000:]
    # the terminal: one line per finished cell; the aggregate and `all` list one marker per job, not
    # every cell, and the reason lines (a job's outputs again) are quiet (profiles/default)
    out = proc.stdout + proc.stderr
    assert len(re.findall(r"^\[longca\] \d+/\d+ \S+ .*: ok ", out, flags=re.M)) == 32
    # the cells the capabilities rule out: a line per kernel, mask and reason
    refused = re.findall(r"^\[longca\] (\d+) cell\(s\) of \S+ \S+ unsupported", out, flags=re.M)
    assert sum(map(int, refused)) == 4, refused
    assert "reason:" not in out and "cells/sweep=" not in out
    assert max(len(line) for line in out.splitlines()) <= 300

    # Nothing to do on a second run.
    proc = snakemake(workdir, spec)
    assert "Nothing to be done" in proc.stdout + proc.stderr

    # Deleting one cell reruns that cell, the aggregate and the report only.
    victim = files[5]
    others = {f: f.stat().st_mtime_ns for f in files if f != victim}
    victim.unlink()
    proc = snakemake(workdir, spec)
    ran = jobs_run(proc)
    assert sorted(r for r in ran if not r.startswith("cells_")) == ["aggregate", "all", "report"]
    assert len([r for r in ran if r.startswith("cells_")]) == 1
    assert victim.exists()
    assert {f: f.stat().st_mtime_ns for f in others} == others, "an untouched cell was rerun"

    # Adding one axis value runs only the new cells.
    spec = write_spec(workdir, seqlens="[64, 128, 96]")
    proc = snakemake(workdir, spec)
    new = [f for f in cell_files(workdir) if f not in files]
    assert len(new) == 3 * 3 * 2 and all("seqlen_q=96" in str(f) for f in new)
    assert {f: f.stat().st_mtime_ns for f in others} == others
    n_cells = duckdb.sql(f"SELECT count(DISTINCT cell_id) FROM '{agg}'").fetchall()[0][0]
    assert n_cells == 54


def test_damaged_result_is_named_and_rerun(workdir):
    spec = write_spec(workdir, seqlens="[64]")
    snakemake(workdir, spec)
    victim = cell_files(workdir)[3]
    victim.write_bytes(victim.read_bytes()[:50])  # truncated
    proc = snakemake(workdir, spec)
    assert "damaged result" in proc.stderr and victim.name in proc.stderr
    assert pq.read_table(victim).num_rows >= 1


@pytest.mark.parametrize("stop", ["SIGKILL group", "Ctrl-C"])
def test_sigkill_mid_sweep_then_resume_exactly_once(workdir, stop, live_processes):
    def _run_processes(marker: str) -> list[str]:
        return list(live_processes(marker).values())

    spec = write_spec(workdir, seqlens="[64, 128, 192]", chunk=4)
    cmd = [sys.executable, "-m", "snakemake", "--cores", "1", "--config", f"spec={spec}"]
    tmp = workdir / "tmp"  # every process of the run names its job files there
    tmp.mkdir()
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    deadline = time.time() + 300
    while time.time() < deadline and len(cell_files(workdir)) < 8:
        time.sleep(0.2)
    # SIGKILL: snakemake and every job it started; Ctrl-C: SIGINT to the terminal's process group
    os.killpg(proc.pid, signal.SIGKILL if stop == "SIGKILL group" else signal.SIGINT)
    proc.wait(timeout=120)
    done_before = len(cell_files(workdir))
    assert 8 <= done_before < 54, done_before
    end = time.time() + 15
    while _run_processes(str(tmp)) and time.time() < end:
        time.sleep(0.2)
    assert not _run_processes(str(tmp)), _run_processes(str(tmp))  # no worker outlives the run
    # No half-written files: every file present is sound.
    from longca.store.read import damage

    assert [damage(f) for f in cell_files(workdir) if damage(f)] == []
    snakemake(workdir, spec, "--unlock")
    snakemake(workdir, spec)
    files = cell_files(workdir)
    assert len(files) == 54
    ids = duckdb.sql(
        f"SELECT cell_id, mask_sample, count(*) n FROM '{workdir}/results/tiny/all.parquet' GROUP BY ALL HAVING n > 1"
    ).fetchall()
    assert ids == [], "duplicate rows"
    assert (
        duckdb.sql(f"SELECT count(DISTINCT cell_id) FROM '{workdir}/results/tiny/all.parquet'").fetchall()[0][0] == 54
    )
    # the interruption is no cell's result: the statuses of a clean run (sdpa_flash takes no document mask)
    statuses = duckdb.sql(f"SELECT DISTINCT status FROM '{workdir}/results/tiny/all.parquet'").fetchall()
    assert sorted(s for (s,) in statuses) == ["ok", "unsupported"]

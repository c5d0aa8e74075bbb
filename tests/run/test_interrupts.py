"""An interrupted run loses nothing and invents nothing. A small CPU spec (single-device and CP
cells) is stopped at 10 seeded moments by the signals a user or a scheduler sends (SIGINT, SIGTERM,
SIGKILL of the supervisor alone or of its whole process group), each time resumed to the end: the
cells, their statuses and their row counts equal a clean run's, no row says an interruption, and
no process of the run is left after a stop."""

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

SPEC = """
name: interrupts
device: cpu
repeat: {warmup: 1, iters: 5, min_iters: 3, budget_s: 0.05, l2_flush: false}
check: {max_seqlen: 256}
timeout_s: 120
mask_samples: {multi_document: 2, single: 1}
heads: ["4:2"]
head_dims: [32]
dtypes: [float32]
passes: [fwd, bwd]
sweeps:
  - name: dense
    kernels: [naive, sdpa_math, sdpa_flash]
    masks: [full, causal, causal_document, {name: sliding_window, window: 64}]
    seqlens: [256, 512]
  - name: cp
    kernels: [naive]
    masks: [causal]
    seqlens: [256]
    cp: {mechanisms: [ulysses, ring_p2p], world_sizes: [2], backend: gloo}
"""
STOPS = ("SIGINT", "SIGTERM", "SIGKILL supervisor", "SIGKILL group")


def _run(spec: Path, results: Path, env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "longca.cli", "run", "--spec", str(spec), "--results", str(results)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _outcome(results: Path) -> Counter:
    rows = pl.read_parquet(sorted(results.rglob("cell-*.parquet")))
    per_cell = rows.group_by("cell_digest").agg(pl.col("status").first(), pl.len().alias("rows"))
    return Counter(per_cell.iter_rows())


def _stop(proc: subprocess.Popen, how: str) -> None:
    if how == "SIGKILL group":
        os.killpg(proc.pid, signal.SIGKILL)
    else:
        proc.send_signal({"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}.get(how, signal.SIGKILL))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the run's processes are found in /proc")
def test_runs_stopped_at_random_moments_resume_to_the_clean_runs_rows(tmp_path, live_processes):
    def _left(marker: str) -> list[str]:
        return list(live_processes(marker).values())

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    work = tmp_path / "tmp"  # every process of a run names its job files, under TMPDIR
    work.mkdir()
    env = dict(os.environ, TMPDIR=str(work), PYTHONUNBUFFERED="1")

    t0 = time.monotonic()
    clean = _run(spec, tmp_path / "clean", env)
    assert clean.wait(timeout=600) == 0, clean.stderr.read()[-3000:]
    clean_s = time.monotonic() - t0
    expected = _outcome(tmp_path / "clean")
    assert sum(n for (_, _, n) in expected) > 40 and {s for (_, s, _) in expected} == {"ok", "unsupported"}

    rng = random.Random(73)
    results = tmp_path / "stopped"
    for k in range(10):
        how = STOPS[k % len(STOPS)]
        moment = rng.uniform(0.5, max(clean_s * 0.8, 1.0))
        proc = _run(spec, results, env)
        try:
            proc.wait(timeout=moment)  # a resumed run can end before its moment: nothing to stop then
        except subprocess.TimeoutExpired:
            _stop(proc, how)
            proc.wait(timeout=60)
        end = time.monotonic() + 15
        while _left(str(work)) and time.monotonic() < end:
            time.sleep(0.2)
        assert not _left(str(work)), (k, how, _left(str(work)))
    resumed = _run(spec, results, env)
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read()[-3000:]
    got = _outcome(results)
    assert got == expected, (got - expected, expected - got)
    reasons = pl.read_parquet(sorted(results.rglob("cell-*.parquet")))["reason"].drop_nulls().to_list()
    assert not [r for r in reasons if "Broken pipe" in r or "Interrupt" in r or "signal" in r]

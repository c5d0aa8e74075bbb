"""The benchmark under a real SLURM cluster: `snakemake --profile profiles/slurm`.

Needs a running cluster whose nodes see this file system; CI starts a one-node one with
.ci/slurm/up.sh. Without one these tests skip, unless LONGCA_REQUIRE_SLURM=1 (set by .ci/run),
which turns the skip into a failure so that CI cannot pass without running them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from wf import ROOT, copy_workflow, jobs_run

# One worker runs them all, beside the README's default run they compare with (tests/test_readme.py):
# they share the one-node cluster and the session's default run.
pytestmark = pytest.mark.xdist_group("default_run")

# Far above the measured times (docs/slurm-ci.md): a hang fails the test instead of stalling CI.
LIMIT_S = 540

# The cancel test's spec: the default spec's shape, small. Two sweeps give two independent cell
# jobs that run side by side on a 2-CPU node, so one can be cancelled while the other finishes.
CANCEL_SPEC = """
name: cancel
device: cpu
seed: 0
repeat: {warmup: 0, iters: 2, min_iters: 1, budget_s: 0.1, l2_flush: false}
check: {enabled: true, max_seqlen: 256}
timeout_s: 120
mask_samples: {multi_document: 2, single: 1}
heads: ["4:2"]
head_dims: [32]
dtypes: [float32]
passes: [fwd, bwd]
batch: [1]
kernels: [naive, sdpa_math]
masks: [causal, causal_document]
seqlens: [256]
sweeps: [{name: a}, {name: b}]
"""

# A CUDA spec: a single-device cell job and a 2-process CP job, with no cell the planner
# already knows to be unsupported (so every cell job must ask SLURM for GPUs).
GPU_SPEC = """
name: gpu
device: cuda
heads: ["4:2"]
head_dims: [64]
dtypes: [bfloat16]
passes: [fwd]
batch: [1]
sweeps:
  - {name: dense, kernels: [sdpa_math], masks: [causal], seqlens: [1024]}
  - {name: cp, kernels: [naive], masks: [causal], seqlens: [1024], cp: {mechanisms: [ring_p2p], world_sizes: [2]}}
"""


def _slurm_problem() -> str | None:
    """Why SLURM cannot run jobs here, or None when a node is ready."""
    for tool in ("sinfo", "sbatch", "squeue", "scancel", "scontrol"):
        if not shutil.which(tool):
            return f"SLURM client command {tool} is not installed"
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo timed out (slurmctld not answering)"
    if out.returncode != 0:
        return f"sinfo failed: {out.stderr.strip()[:200]}"
    states = [s.rstrip("*~#$@^-+") for s in out.stdout.split()]
    if not any(s in ("idle", "mix", "mixed", "alloc", "allocated") for s in states):
        return f"no SLURM node is up (node states: {states})"
    return None


@pytest.fixture(scope="module")
def slurm() -> None:
    problem = _slurm_problem()
    if problem:
        if os.environ.get("LONGCA_REQUIRE_SLURM") == "1":
            pytest.fail(f"LONGCA_REQUIRE_SLURM=1 but {problem}")
        pytest.skip(problem)


def _workspace(dest: Path, **specs: str) -> Path:
    """A copy of the workflow, so runs never touch the repository's results/ and reports/."""
    dest.mkdir(parents=True)
    copy_workflow(dest)
    shutil.copy(ROOT / "specs" / "default.yaml", dest / "specs" / "default.yaml")
    for name, text in specs.items():
        (dest / "specs" / f"{name}.yaml").write_text(text)
    return dest


def _jobs(ws: Path, fields: str = "%T|%k") -> dict[str, list[str]]:
    """SLURM jobs started from this workspace: job id -> the squeue fields asked for (default:
    state and comment, where the plugin writes `rule_<rule name>`). squeue shows finished jobs
    for MinJobAge seconds (an hour on the CI cluster)."""
    n = fields.count("|") + 1
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", f"%i|%Z|{fields}"], capture_output=True, text=True, timeout=15, check=True
    ).stdout
    jobs = {}
    for line in out.splitlines():
        jid, workdir, *rest = (line.split("|", n + 1) + [""] * (n + 1))[: n + 2]
        if workdir and Path(workdir).resolve() == ws.resolve():
            jobs[jid] = rest
    return jobs


def _cancel_leftovers(ws: Path) -> None:
    """Cancel jobs a killed Snakemake left behind (only this workspace's)."""
    live = [j for j, (state, _) in _jobs(ws).items() if state in ("PENDING", "RUNNING", "CONFIGURING")]
    if live:
        subprocess.run(["scancel", *live], timeout=15)


def _cmd(spec: str, *extra: str) -> list[str]:
    return [
        "timeout",
        "-s",
        "KILL",
        str(LIMIT_S),
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        "profiles/slurm",
        "--config",
        f"spec={spec}",
        *extra,
    ]


def _watch(ws: Path, proc: subprocess.Popen) -> None:
    """Fail fast on a job SLURM can never start (reason PartitionConfig: it asks for more CPUs,
    memory or time than the partition has); the plugin would wait for it forever."""
    for jid, (state, reason, cpus, comment) in _jobs(ws, "%T|%r|%C|%k").items():
        if state == "PENDING" and reason == "PartitionConfig":
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _cancel_leftovers(ws)
            info = subprocess.run(["sinfo", "-h", "-o", "%c CPUs, %m MB"], capture_output=True, text=True).stdout
            pytest.fail(
                f"SLURM job {jid} ({comment}) can never start: it asks for {cpus} CPUs (or more "
                f"memory or time than the partition allows); the node has {info.strip()}"
            )


def _run(ws: Path, cmd: list[str], log_path: Path) -> subprocess.CompletedProcess:
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ws, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                _watch(ws, proc)
                time.sleep(2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _cancel_leftovers(ws)
    return subprocess.CompletedProcess(cmd, proc.returncode, log_path.read_text(), "")


def _log(proc) -> str:
    return f"exit {proc.returncode}\n{proc.stdout[-10000:]}"


def _cell_files(ws: Path, spec: str) -> dict[str, int]:
    """Cell result files: path relative to the spec's results -> modification time (ns)."""
    base = ws / "results" / spec / "cells"
    return {str(p.relative_to(base)): p.stat().st_mtime_ns for p in base.rglob("cell-*.parquet")}


def _rows(ws: Path, spec: str):
    return pq.read_table(ws / "results" / spec / "all.parquet")


def _keys(table) -> Counter:
    return Counter(
        (r["cell_id"], r["mask_sample"], r["status"])
        for r in table.select(["cell_id", "mask_sample", "status"]).to_pylist()
    )


def _no_duplicates(table) -> None:
    keys = [(r["cell_id"], r["mask_sample"]) for r in table.select(["cell_id", "mask_sample"]).to_pylist()]
    assert len(keys) == len(set(keys)), [k for k, n in Counter(keys).items() if n > 1][:5]


def test_default_spec_through_slurm_matches_a_local_run(slurm, tmp_path, default_local_run):
    # The local reference is the session's one run of the default spec (tests/conftest.py, also the
    # README's first command): the same spec and workflow, run with `--cores 2`.
    local, ref = default_local_run
    assert ref.returncode == 0, (ref.stdout[-3000:], ref.stderr[-3000:])
    remote = _workspace(tmp_path / "slurm")
    t0 = time.monotonic()
    proc = _run(remote, _cmd("specs/default.yaml"), tmp_path / "slurm.log")
    wall = time.monotonic() - t0
    assert proc.returncode == 0, _log(proc)
    out = proc.stdout + proc.stderr

    # Every cell job went through sbatch and completed there; none ran on the submitting host.
    ran = jobs_run(proc)
    cell_rules = [r for r in ran if r.startswith("cells_")]
    assert cell_rules and not re.search(r"^\s*localrule cells_", out, re.M)
    jobs = _jobs(remote)
    by_rule = {c.removeprefix("rule_"): (jid, state) for jid, (state, c) in jobs.items()}
    assert sorted(r for r in by_rule if r.startswith("cells_")) == sorted(cell_rules), (by_rule, cell_rules)
    assert all(state == "COMPLETED" for _, state in by_rule.values()), jobs
    assert out.count("has been submitted with SLURM jobid") == len(jobs)
    # The aggregate and the report followed (as SLURM jobs, or as local rules if so declared).
    assert {"aggregate", "report"} <= set(ran)

    # The context-parallel cells ran as one SLURM job of 2 tasks (gloo, launched with srun).
    cp = [jid for rule, (jid, _) in by_rule.items() if rule.startswith("cells_cp_")]
    assert cp, f"the default spec has no CP cell job: {sorted(by_rule)}"
    for jid in cp:
        info = subprocess.run(["scontrol", "show", "job", jid], capture_output=True, text=True, timeout=15).stdout
        assert re.search(r"\bNumTasks=2\b", info), info

    # Same cells, same statuses, same schema as the local run, each cell exactly once.
    got, want = _rows(remote, "default"), _rows(local, "default")
    assert got.schema.remove_metadata().equals(want.schema.remove_metadata()), (got.schema, want.schema)
    assert _keys(got) == _keys(want)
    assert set(_cell_files(remote, "default")) == set(_cell_files(local, "default"))
    _no_duplicates(got)
    cp_rows = [r for r in got.select(["world_size", "cp_mechanism", "status"]).to_pylist() if r["cp_mechanism"]]
    assert cp_rows and {r["world_size"] for r in cp_rows} == {2}
    assert (remote / "reports" / "default" / "index.html").stat().st_size > 0
    print(f"SLURM run of the default spec: {wall:.0f} s, {len(jobs)} SLURM jobs")


def test_cancelled_job_then_rerun_completes_only_what_is_missing(slurm, tmp_path):
    ws = _workspace(tmp_path / "slurm", cancel=CANCEL_SPEC)
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        first = subprocess.Popen(
            _cmd("specs/cancel.yaml"), cwd=ws, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            victim = None
            deadline = time.monotonic() + 240
            while victim is None and time.monotonic() < deadline and first.poll() is None:
                running = [
                    (jid, c)
                    for jid, (state, c) in _jobs(ws).items()
                    if state == "RUNNING" and c.startswith("rule_cells_")
                ]
                victim = running[0] if running else None
                time.sleep(0.5)
            assert victim, "no cell job was seen RUNNING:\n" + log_path.read_text()[-4000:]
            subprocess.run(["scancel", victim[0]], check=True, timeout=15)
            code = first.wait(timeout=LIMIT_S)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
                first.wait()
            _cancel_leftovers(ws)
    text = log_path.read_text()
    assert code != 0, text[-4000:]  # Snakemake reports the failure ...
    assert f"SLURM-job '{victim[0]}' failed" in text and "CANCELLED" in text, text[-4000:]
    assert _jobs(ws)[victim[0]][0] == "CANCELLED"
    assert not (ws / "results" / "cancel" / "all.parquet").exists()
    cancelled_sweep = re.match(r"rule_cells_(\w+?)_device_", victim[1]).group(1)
    other = {"a": "b", "b": "a"}[cancelled_sweep]

    before = _cell_files(ws, "cancel")
    # ... after letting the other job finish (--keep-going): its cells are all there, none of the
    # cancelled job's (Snakemake removes a failed job's partial outputs).
    assert before and all(p.startswith(f"sweep={other}/") for p in before), sorted(before)

    second = _run(ws, _cmd("specs/cancel.yaml"), tmp_path / "second.log")
    assert second.returncode == 0, _log(second)
    assert "has been submitted with SLURM jobid" in second.stdout, _log(second)
    assert not re.search(r"^\s*localrule cells_", second.stdout, re.M)
    ran = jobs_run(second)
    assert sorted(r for r in ran if not r.startswith("cells_")) == ["aggregate", "all", "report"], ran
    assert [r.split("_")[1] for r in ran if r.startswith("cells_")] == [cancelled_sweep], ran

    after = _cell_files(ws, "cancel")
    redone = {p for p in after if before.get(p) != after[p]}
    assert redone == set(after) - set(before), "a finished cell was run again"
    assert redone and all(p.startswith(f"sweep={cancelled_sweep}/") for p in redone)
    assert len(after) == 2 * len(before)  # both sweeps have the same cells

    table = _rows(ws, "cancel")
    _no_duplicates(table)
    assert len(set(table.column("cell_id").to_pylist())) == len(after)
    assert set(table.column("status").to_pylist()) <= {"ok", "unsupported"}


def _sbatch_geometry(call: str) -> tuple[int, int]:
    """(GPUs, tasks) that an sbatch command line asks for."""
    gpus = re.search(r"--gpus[= ](?:\w+:)?(\d+)", call)
    per_gpu = re.search(r"--ntasks-per-gpu[= ](\d+)", call)
    ntasks = re.search(r"--ntasks[= ](\d+)", call)
    n_gpus = int(gpus.group(1)) if gpus else 0
    if per_gpu:
        return n_gpus, n_gpus * int(per_gpu.group(1))
    return n_gpus, int(ntasks.group(1)) if ntasks else 1


def test_cuda_cell_jobs_ask_slurm_for_one_gpu_per_process(slurm, tmp_path):
    """GPU scheduling cannot run here (no GPU, so no GRES); the real sbatch still judges the
    request: it must reject every cell job of a CUDA spec for asking for GPUs the cluster lacks,
    one per process. A job it accepts asked for none."""
    ws = _workspace(tmp_path / "slurm", gpu=GPU_SPEC)
    log_path = tmp_path / "gpu.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            _cmd("specs/gpu.yaml"), cwd=ws, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            while proc.poll() is None and not _jobs(ws):
                time.sleep(1)
            accepted = _jobs(ws)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            _cancel_leftovers(ws)
    text = log_path.read_text()
    assert not accepted, f"SLURM accepted cell jobs of a CUDA spec that ask for no GPU: {accepted}"
    assert proc.returncode != 0
    calls = dict(re.findall(r"Error in rule (cells_\w+):.*?sbatch call:\s*(sbatch [^\n]+)", text, re.S))
    assert calls, text[-4000:]
    assert "Invalid generic resource" in text, text[-4000:]
    geometry = {rule.split("_")[1]: _sbatch_geometry(call) for rule, call in calls.items()}
    assert geometry == {"dense": (1, 1), "cp": (2, 2)}, calls

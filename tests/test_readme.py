"""Every shell command, spec snippet and SQL example of the README runs here, as written where the CI
machine can (a CPU, no GPU, a one-node SLURM cluster), and every command has an entry below: a
README command without one fails `test_every_readme_command_is_covered`.

How each runs (COMMANDS): `run` as written, in a copy of the repository's workflow where it would
write files; `dry` with Snakemake's --dry-run (a GPU spec's jobs would run on GPUs: the DAG, the
spec's validation and the planning run, no job); `ci` is CI's own command (.ci/run runs exactly
this line; checked to be there); `pip` is the GPU extra, whose packages need CUDA: its pins are
checked in pyproject.toml, and the extra is installed on the GPU host (docs/gpu-host.md).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def blocks(lang: str, path: Path = README) -> list[str]:
    """The bodies of the fenced blocks of one language."""
    return re.findall(rf"^```{lang}\n(.*?)^```", path.read_text(encoding="utf-8"), flags=re.S | re.M)


def commands(path: Path = README) -> list[str]:
    """Every shell command of the bash blocks: comments dropped, one command per line."""
    out = []
    for body in blocks("bash", path):
        for line in body.splitlines():
            cmd = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if cmd and not line.lstrip().startswith("#"):
                out.append(cmd)
    return out


# README command -> how this file runs it
COMMANDS = {
    "pip install torch==2.13.0 && pip install -e . && snakemake --cores 2": "run-default",
    'pip install torch==2.13.0 && pip install -e ".[test,slurm]" && ruff check . && ruff format --check . '
    "&& python -m pytest -q -n 2 --dist loadgroup": "ci",
    'pip install -e ".[gpu,slurm]"': "pip",
    "snakemake --cores 8 --config spec=specs/h200.yaml": "dry",
    "snakemake --profile profiles/slurm --config spec=specs/h200.yaml": "dry",
    "longca run --spec specs/core.yaml --results 'results/{card}'": "run-card",
    "longca run --spec specs/h200.yaml --shard 0/2": "run-cpu",
    "longca run --spec specs/h200.yaml --sweep dense --only seqlen=32K": "run-cpu",
    "longca run --spec specs/h200.yaml --retry error": "run-cpu",
    "longca plan specs/h200.yaml": "run",
    "longca plan specs/h200.yaml --rows results/h200/all.parquet": "run",
    "longca compare results/h200/all.parquet results/h200-workflow/all.parquet --html /tmp/cmp": "run",
    "longca compare BASE.parquet NEW.parquet --fail-on slower": "run-compare",
    "longca repro @847b892f": "run",
    "longca model cp --spec specs/cp-scale.yaml --cluster specs/clusters/h200-ib.yaml --rates results/h200/all.parquet "
    "--sweep tokens_8k_w8 --out /tmp/cp-model.parquet": "run",
    "longca model validate --cluster specs/clusters/h200-nvlink.yaml --rates results/h200/all.parquet "
    "--cp-rows results/h200-cp/all.parquet --cp-spec specs/h200-cp.yaml --out /tmp/cp-validation.csv": "run",
    "pip install -e '.[slurm]'": "ci",
    "cp -r profiles/slurm profiles/mycluster": "run",
    "snakemake --profile profiles/mycluster --config spec=specs/h200.yaml": "dry",
    'pip install -e ".[test,mutation]"': "mutation",
    'mutmut run "longca.store.*" "longca.run.*" "longca.measure.stats.*" "longca.measure.flops.*" '
    '"longca.cp.sharding.*"': "mutation",
    "mutmut results": "mutation",
}


def test_every_readme_command_is_covered():
    found = commands()
    assert found, "no bash blocks found in the README"
    assert set(found) == set(COMMANDS), (
        f"README commands without a test here: {sorted(set(found) - set(COMMANDS))}; "
        f"entries here no longer in the README: {sorted(set(COMMANDS) - set(found))}"
    )


def _longca(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "longca.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def _copy_repo_for_run(copy_workflow, dest: Path) -> Path:
    """The workflow (the `copy_workflow` fixture) and the published H200 rows the commands read."""
    copy_workflow(dest)
    (dest / "results" / "h200").mkdir(parents=True)
    shutil.copy(ROOT / "results" / "h200" / "all.parquet", dest / "results" / "h200" / "all.parquet")
    return dest


@pytest.mark.parametrize("cmd", [c for c, how in COMMANDS.items() if how == "run"])
def test_commands_run_as_written(cmd: str, tmp_path: Path, copy_workflow):
    work = _copy_repo_for_run(copy_workflow, tmp_path / "repo")
    if "results/h200-workflow" in cmd:
        shutil.copytree(ROOT / "results" / "h200-workflow", work / "results" / "h200-workflow")
        cmd = cmd.replace("/tmp/cmp", str(tmp_path / "cmp"))
    if "results/h200-cp" in cmd:
        shutil.copytree(ROOT / "results" / "h200-cp", work / "results" / "h200-cp")
    cmd = cmd.replace("/tmp/cp-model.parquet", str(tmp_path / "cp-model.parquet"))
    cmd = cmd.replace("/tmp/cp-validation.csv", str(tmp_path / "cp-validation.csv"))
    argv = shlex.split(cmd)
    if argv[0] == "longca":
        proc = _longca(*argv[1:], cwd=work)
    else:
        proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-2000:])
    if argv[:2] == ["longca", "plan"]:
        assert "cells in" in proc.stdout
    if argv[:2] == ["longca", "repro"]:
        assert "longca run --spec specs/" in proc.stdout
    if argv[:2] == ["longca", "compare"]:
        assert (tmp_path / "cmp" / "index.html").is_file()
    if argv[0] == "cp":
        assert (work / "profiles" / "mycluster" / "config.yaml").is_file()
    if argv[:3] == ["longca", "model", "validate"]:
        assert len((tmp_path / "cp-validation.csv").read_text().splitlines()) > 1
    if argv[:3] == ["longca", "model", "cp"]:
        model = duckdb.sql(f"SELECT source, status FROM '{tmp_path / 'cp-model.parquet'}'").fetchall()
        assert model and set(model) == {("model", "ok")}


def test_compare_with_fail_on_is_a_ci_gate(tmp_path: Path):
    # BASE/NEW stand for any two result sets: the published set against itself passes, a copy with
    # one cell 10% slower fails (exit 1)
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    base = ROOT / "results" / "h200-workflow" / "all.parquet"
    table = pq.read_table(base)
    digest = table["cell_digest"][0].as_py()
    slow = pc.equal(table["cell_digest"], digest)
    samples = table["samples_ms"].to_pylist()
    table = table.set_column(
        table.schema.get_field_index("samples_ms"),
        "samples_ms",
        pa.array(
            [[x * 1.1 for x in s] if hit else s for s, hit in zip(samples, slow.to_pylist())], table["samples_ms"].type
        ),
    )
    new = tmp_path / "NEW.parquet"
    pq.write_table(table, new)
    assert _longca("compare", str(base), str(base), "--fail-on", "slower").returncode == 0
    assert _longca("compare", str(base), str(new), "--fail-on", "slower").returncode == 1
    assert COMMANDS["longca compare BASE.parquet NEW.parquet --fail-on slower"] == "run-compare"


@pytest.mark.parametrize("cmd", [c for c, how in COMMANDS.items() if how == "run-cpu"])
def test_run_commands_on_a_machine_without_the_gpu(cmd: str, tmp_path: Path, copy_workflow):
    # The spec names its GPU model (gpu_model: H200): as written, the command stops before any cell
    # file, naming the field. Without that line its cells are CUDA cells: here every selected one
    # ends as an `unsupported` row that says why, without a GPU touched; --shard 0/2 is limited to
    # one sweep to keep CI short.
    work = _copy_repo_for_run(copy_workflow, tmp_path / "repo")
    argv = shlex.split(cmd)[1:]
    if "--shard" in argv:
        argv += ["--sweep", "shapes"]
    if "--retry" in argv:
        argv += ["--sweep", "long_fp8"]
    proc = _longca(*argv, "--results", str(tmp_path / "results"), cwd=work)
    assert proc.returncode == 2, (cmd, proc.stdout[-2000:], proc.stderr[-3000:])
    assert "spec field 'gpu_model': 'H200': this machine has no CUDA GPU" in proc.stderr, proc.stderr[-3000:]
    assert not list((tmp_path / "results").rglob("*.parquet"))
    spec = work / "specs" / "h200.yaml"
    text = spec.read_text()
    assert text.count("\ngpu_model: H200") == 1
    spec.write_text("\n".join(line for line in text.splitlines() if not line.startswith("gpu_model:")) + "\n")
    proc = _longca(*argv, "--results", str(tmp_path / "results"), cwd=work)
    assert proc.returncode == 0, (cmd, proc.stdout[-2000:], proc.stderr[-3000:])
    written = list((tmp_path / "results" / "h200").rglob("*.parquet"))
    assert written, proc.stdout[-2000:]
    import polars as pl

    rows = pl.read_parquet(written)
    assert set(rows.get_column("status")) == {"unsupported"}


def test_a_card_set_run_on_a_machine_without_a_gpu_stops_before_any_cell(tmp_path: Path, copy_workflow):
    # results/{card}: the set of the card the run is on; a machine without a GPU has none
    (cmd,) = [c for c, how in COMMANDS.items() if how == "run-card"]
    work = _copy_repo_for_run(copy_workflow, tmp_path / "repo")
    proc = _longca(*shlex.split(cmd)[1:], cwd=work)
    assert proc.returncode == 2, (cmd, proc.stdout[-2000:], proc.stderr[-2000:])
    assert proc.stderr.strip() == (
        "longca: error: results/{card}: this machine has no CUDA GPU, so its rows belong to no card's set"
    )
    assert not list(work.glob("results/*/core"))


def test_snakemake_commands_plan_every_job(tmp_path: Path, copy_workflow):
    # The dry runs build the DAG of 6144 cells, about 20 s of one core each: all three start at once,
    # each in its own copy of the workflow, and each must succeed on its own.
    procs = {}
    for i, cmd in enumerate(c for c, how in COMMANDS.items() if how == "dry"):
        work = _copy_repo_for_run(copy_workflow, tmp_path / f"repo{i}")
        if "profiles/mycluster" in cmd:
            shutil.copytree(work / "profiles" / "slurm", work / "profiles" / "mycluster")
        argv = [sys.executable, "-m", *shlex.split(cmd), "--dry-run"]  # the profiles' own quiet settings
        procs[cmd] = subprocess.Popen(argv, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert len(procs) == 3
        for cmd, proc in procs.items():
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, (cmd, out[-3000:], err[-3000:])
            assert "aggregate" in out + err, cmd
            # a screenful per sweep and a summary, never every job's cell paths (was 1.3-2.5 MB)
            assert len((out + err).encode()) < 100_000 and "cells/sweep=" not in out + err, cmd
    finally:
        for proc in procs.values():
            proc.kill()  # a no-op for a finished process; no dry run outlives a failed one


# With the tests spread over workers (pytest-xdist, README), the users of the session's one default
# run share a worker, and so do the SLURM tests, which share the one-node cluster.
@pytest.mark.xdist_group("default_run")
def test_the_default_run_produces_rows_and_a_report(default_local_run):
    """`snakemake --cores 2` after the installs (CI installed the package): the default spec's real
    run, its Parquet and its report (the session's one run of it, tests/conftest.py)."""
    work, proc = default_local_run
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    assert (work / "results" / "default" / "all.parquet").stat().st_size > 0
    assert (work / "reports" / "default" / "index.html").is_file()
    out = proc.stdout + proc.stderr
    assert "report:" in out  # the closing summary names the report
    # output a person reads: a line per cell, never a job's list of cell paths
    assert len(out.encode()) < 40_000, len(out.encode())
    assert max(len(line) for line in out.splitlines()) <= 300
    assert "cells/sweep=" not in out


def test_the_ci_command_is_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    flat = re.sub(r"\s*\\\n\s*", " ", ci).replace("python3 -m pip", "pip").replace("python3 -m ", "")
    flat = re.sub(r"\s+-q\b(?= )", "", flat)
    readme = next(c for c, how in COMMANDS.items() if how == "ci" and "pytest" in c)
    assert readme.replace("python -m pytest -q", "pytest") in flat.replace("pytest -q", "pytest")
    assert 'pip install -e ".[test,slurm]"' in flat  # the slurm extra's install is part of it


def test_the_gpu_extra_is_pinned():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # the kernel packages pinned to versions seen working together on the H200 (triton follows torch)
    pinned = {req.split("==")[0].split("[")[0] for req in extras["gpu"] if "==" in req}
    assert {"flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cudnn-frontend", "fla-core"} <= pinned
    assert "slurm" in extras


def test_every_spec_snippet_loads():
    from longca.spec.load import load_spec

    snippets = [b for b in blocks("yaml") if "sweeps:" in b]
    assert snippets
    for text in snippets:
        spec = load_spec(text=text.replace("description: ...", "description: README example"))
        assert spec.sweeps


def test_the_profile_snippet_names_keys_the_slurm_profile_has():
    profile = yaml.safe_load((ROOT / "profiles" / "slurm" / "config.yaml").read_text())
    snippet = next(b for b in blocks("yaml") if "default-resources" in b)
    keys = set(yaml.safe_load(snippet)["default-resources"])
    known = set(profile.get("default-resources", {})) | {"slurm_partition", "slurm_account", "constraint"}
    assert keys <= known, keys - known


def test_the_sql_examples_run_on_the_published_set():
    docs = [README, ROOT / "docs" / "schema.md"]
    queries = [q for path in docs for q in blocks("sql", path)]
    assert queries
    for q in queries:
        rows = duckdb.connect().execute(q.replace("'results/", f"'{ROOT}/results/")).fetchall()
        assert rows


def test_the_mutation_commands_name_what_mutmut_is_set_to_mutate():
    """The mutation run takes minutes per module (README, Reliability): not run here, but each
    pattern it names must match modules `pyproject.toml` lets mutmut mutate, and the extra exists."""
    import fnmatch
    import shlex
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["optional-dependencies"]["mutation"] == ["mutmut==3.8.1"]
    modules = [p.removesuffix(".py").replace("/", ".") for p in project["tool"]["mutmut"]["only_mutate"]]
    run = next(c for c, how in COMMANDS.items() if how == "mutation" and c.startswith("mutmut run"))
    for pattern in shlex.split(run)[2:]:
        assert any(fnmatch.fnmatch(m + ".x_f", pattern) for m in modules), pattern

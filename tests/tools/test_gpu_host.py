"""tools/gpu-host.sh, run on the CPU over a small work tree: a committed aggregate that cannot be
restored stops the call before any cell runs; carried packages are importable by what the call
runs; a re-run into another folder returns that folder's aggregate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tree(tmp_path: Path, unreadable_aggregate: bool = True) -> Path:
    """A work tree with the package and, unless told otherwise, a committed aggregate that cannot be read."""
    work = tmp_path / "tree"
    (work / "results" / "default").mkdir(parents=True)
    if unreadable_aggregate:
        (work / "results" / "default" / "all.parquet").write_bytes(b"not parquet")
    (work / "longca").symlink_to(ROOT / "longca")
    return work


def _call(
    work: Path, out: Path, limit: int, *args: str, spec: Path = ROOT / "specs" / "default.yaml", **env: str
) -> subprocess.CompletedProcess:
    """`gpu-host.sh OUT SPEC LIMIT ARGS` in `work`; host folders under `work`'s parent."""
    (work.parent / "host-tmp").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "TMPDIR": str(work.parent / "host-tmp"),
        **env,
    }
    return subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu-host.sh"), str(out), str(spec), str(limit), *args],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_a_failed_unpack_stops_the_call_before_measuring(tmp_path: Path) -> None:
    # A host where the committed cells cannot be restored would measure every cell again; the call
    # must stop instead, say why, and return the unpack log.
    work, out = _tree(tmp_path), tmp_path / "out"
    done = _call(work, out, 60)
    assert done.returncode == 3, done.stderr
    assert "unpacking results/default/all.parquet failed; nothing was measured" in done.stderr
    assert (out / "unpack.log").is_file()
    assert not (work / "results" / "default" / "cells").exists()
    assert not (out / "default.parquet").exists()


def test_a_machine_without_the_specs_gpu_model_stops_the_call_before_set_up(tmp_path: Path) -> None:
    # A lender may hand out another card than the spec's `gpu_model`; the call ends before it unpacks
    # any bundle or restores any cell, says why, and returns the check's log (here: no GPU at all).
    import tarfile

    work, out = _tree(tmp_path, unreadable_aggregate=False), tmp_path / "out"
    text = (ROOT / "specs" / "default.yaml").read_text()
    spec = tmp_path / "default-cuda.yaml"
    spec.write_text(text.replace("\ndevice: cpu\n", "\ndevice: cuda\ngpu_model: H200\n", 1))
    (work / ".bundles").mkdir()
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "probe_bundle.py").write_text("NAME = 'bundle'\n")
    with tarfile.open(work / ".bundles" / "probe.tar.xz", "w:xz") as tar:
        tar.add(tmp_path / "bundle", arcname=".")
    done = _call(work, out, 60, spec=spec)
    assert done.returncode == 4, done.stderr
    assert "failed its check against this machine's GPUs (gpu_model); nothing was measured" in done.stderr
    assert "spec field 'gpu_model': 'H200': this machine has no CUDA GPU" in done.stderr
    assert (out / "gpu-model.log").is_file()
    assert not (tmp_path / "host-tmp" / "bundles").exists()
    assert not (work / "results" / "default" / "cells").exists()
    assert not (out / "default.parquet").exists()


def test_carried_bundles_and_wheels_are_importable_by_what_the_call_runs(tmp_path: Path) -> None:
    # A bundle (a packed site folder, e.g. FlashAttention-4's) and a carried wheel must be on the
    # path of every process the call starts; without them every FA4 cell records "not installed".
    import tarfile
    import zipfile

    work, out = _tree(tmp_path, unreadable_aggregate=False), tmp_path / "out"
    (work / ".bundles").mkdir()
    site = tmp_path / "bundle"
    (site / "nvidia_cutlass_dsl" / "dsl_packages").mkdir(parents=True)
    (site / "probe_bundle.py").write_text("NAME = 'bundle'\n")
    (site / "nvidia_cutlass_dsl" / "dsl_packages" / "probe_dsl.py").write_text("NAME = 'dsl'\n")
    with tarfile.open(work / ".bundles" / "probe.tar.xz", "w:xz") as tar:
        tar.add(site, arcname=".")
    # wheels in .whl/ and in any carried .whl-*/ folder (the linear-attention one travels only when needed)
    for folder, name in ((".whl", "probe_wheel"), (".whl-linear", "probe_linear")):
        (work / folder).mkdir()
        info = f"{name}-1.0.dist-info/"
        with zipfile.ZipFile(work / folder / f"{name}-1.0-py3-none-any.whl", "w") as whl:
            whl.writestr(f"{name}.py", f"NAME = '{name}'\n")
            whl.writestr(info + "METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
            whl.writestr(info + "WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
            whl.writestr(info + "RECORD", "")
    (work / "probe.py").write_text(
        "import sys, probe_bundle, probe_dsl, probe_wheel, probe_linear\n"
        "names = (m.NAME for m in (probe_bundle, probe_dsl, probe_wheel, probe_linear))\n"
        "open(sys.argv[1], 'w').write(' '.join(names))\n"
    )
    # a limit of 45 s leaves no time for cells: the call sets up, runs the probe, and returns
    done = _call(work, out, 45, LONGCA_GPU_BENCH="probe.py {out}/probe.txt")
    assert done.returncode == 0, done.stderr
    assert (out / "probe.txt").read_text() == "bundle dsl probe_wheel probe_linear", (out / "bench.log").read_text()


def test_a_run_into_another_folder_returns_that_folders_aggregate(tmp_path: Path) -> None:
    # A re-run check (`--results DIR --sample N`) is a set of its own: the committed cells are not
    # restored into it (here they could not be: the aggregate is unreadable, which would stop a
    # normal call), and OUTDIR gets the aggregate of DIR, since cell files under OUTDIR nest too
    # deep to come back from a lent machine.
    import pyarrow.parquet as pq

    work, out, rerun = _tree(tmp_path), tmp_path / "out", tmp_path / "rerun"
    only = ["--sweep", "dense", "--only", "kernel=naive", "--only", "seqlen=256"]
    done = _call(work, out, 150, "--results", str(rerun), "--sample", "2", *only)
    assert done.returncode == 0, done.stderr
    assert not (work / "results" / "default" / "cells").exists()
    assert len(list((rerun / "default" / "cells").rglob("*.parquet"))) == 2
    table = pq.read_table(out / "default.parquet", columns=["kernel", "seqlen_q", "cell_digest"])
    assert set(table.column("kernel").to_pylist()) == {"naive"}
    assert set(table.column("seqlen_q").to_pylist()) == {256}
    assert len(set(table.column("cell_digest").to_pylist())) == 2


def test_finished_draws_of_unfinished_cells_travel_to_the_next_call(tmp_path: Path) -> None:
    # A call stopped inside a cell of a sampled mask returns that cell's finished draws; the next
    # call, carrying them as .draws/draws.tar.gz, restores them so the cell measures only the rest.
    # Draws of a cell whose file is written are not returned.
    import tarfile

    work, out = _tree(tmp_path, unreadable_aggregate=False), tmp_path / "out"
    cells = Path("results/default/cells/kernel=naive")
    staged = tmp_path / "staged"
    (staged / cells).mkdir(parents=True)
    for name in ("cell-aaa.draw-0.partial", "cell-bbb.draw-1.partial"):
        (staged / cells / name).write_bytes(b"a draw's row")
    (work / cells).mkdir(parents=True)
    (work / cells / "cell-bbb.parquet").write_bytes(b"a written cell")
    (work / ".draws").mkdir()
    with tarfile.open(work / ".draws" / "draws.tar.gz", "w:gz") as tar:
        tar.add(staged / "results", arcname="results")
    done = _call(work, out, 45)  # no time for cells: restore, then return
    assert done.returncode == 0, done.stderr
    assert (work / cells / "cell-aaa.draw-0.partial").read_bytes() == b"a draw's row"
    with tarfile.open(out / "draws.tar.gz") as tar:
        assert tar.getnames() == [str(cells / "cell-aaa.draw-0.partial")]


def test_a_call_returns_tritons_autotuning_choices_without_its_compiled_kernels(tmp_path: Path) -> None:
    # The whole cache outgrew what a lent machine returns; the choices are what saves minutes.
    import tarfile

    work, out = _tree(tmp_path, unreadable_aggregate=False), tmp_path / "out"
    cache = work / ".triton-cache"
    for name, data in (("a1/chunk_fwd.autotune.json", b"{}"), ("b2/chunk_fwd.cubin", b"\0" * 4096)):
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(data)
    done = _call(work, out, 45)  # no time for cells: set up, then return
    assert done.returncode == 0, done.stderr
    with tarfile.open(out / "triton-autotune.tar.gz") as tar:
        assert [n for n in tar.getnames() if not tar.getmember(n).isdir()] == ["./a1/chunk_fwd.autotune.json"]


def test_a_call_passes_its_time_left_and_the_projections_to_the_run(tmp_path: Path) -> None:
    # gpu-calls.sh leaves results/<name>/estimates.parquet beside the carried rows; the call hands it
    # to `longca run` with its time left (which cells fit: tests/run/test_time_left.py). Here it is
    # not a projections table, and the run says so: it was given both.
    import tarfile

    work, out = _tree(tmp_path, unreadable_aggregate=False), tmp_path / "out"
    (work / "results" / "default" / "estimates.parquet").write_bytes(b"not parquet")
    done = _call(work, out, 90, "--sweep", "dense", "--only", "kernel=naive", "--only", "seqlen=256")
    assert done.returncode == 0, done.stderr
    with tarfile.open(out / "logs.tar.gz") as tar:
        tar.extractall(tmp_path / "logs")
    log = (tmp_path / "logs" / "run-0.log").read_text()
    assert "--estimates 'results/default/estimates.parquet': allowed: a Parquet table with columns" in log


def test_a_spec_that_names_no_card_needs_a_gpu_to_know_its_set(tmp_path: Path) -> None:
    # specs/core.yaml names no card: its rows go to the set of the card the call runs on
    # (results/<card>/core/); a machine without a GPU has no such set, so nothing runs
    work, out = _tree(tmp_path, unreadable_aggregate=False), tmp_path / "out"
    done = _call(work, out, 60, spec=ROOT / "specs" / "core.yaml")
    assert done.returncode == 4, done.stderr
    assert "this machine has no CUDA GPU, so its rows belong to no card's set" in done.stderr
    assert "gpu-host: no result set for" in done.stderr
    assert not list(work.glob("results/*/core")) and not (out / "core.parquet").exists()

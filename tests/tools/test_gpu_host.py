"""tools/gpu-host.sh: a committed aggregate that cannot be restored stops the call before any cell runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_failed_unpack_stops_the_call_before_measuring(tmp_path: Path) -> None:
    # A host where the committed cells cannot be restored would measure every cell again; the call
    # must stop instead, say why, and return the unpack log.
    work = tmp_path / "tree"
    (work / "results" / "default").mkdir(parents=True)
    (work / "results" / "default" / "all.parquet").write_bytes(b"not parquet")
    (work / "longca").symlink_to(ROOT / "longca")
    out = tmp_path / "out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu-host.sh"), str(out), str(ROOT / "specs" / "default.yaml"), "60"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "unpacking results/default/all.parquet failed; nothing was measured" in done.stderr
    assert (out / "unpack.log").is_file()
    assert not (work / "results" / "default" / "cells").exists()
    assert not (out / "default.parquet").exists()


def test_carried_bundles_and_wheels_are_importable_by_what_the_call_runs(tmp_path: Path) -> None:
    # A bundle (a packed site folder, e.g. FlashAttention-4's) and a carried wheel must be on the
    # path of every process the call starts; without them every FA4 cell records "not installed".
    import tarfile
    import zipfile

    work = tmp_path / "tree"
    (work / ".bundles").mkdir(parents=True)
    (work / ".whl").mkdir()
    (work / "longca").symlink_to(ROOT / "longca")
    site = tmp_path / "bundle"
    (site / "nvidia_cutlass_dsl" / "dsl_packages").mkdir(parents=True)
    (site / "probe_bundle.py").write_text("NAME = 'bundle'\n")
    (site / "nvidia_cutlass_dsl" / "dsl_packages" / "probe_dsl.py").write_text("NAME = 'dsl'\n")
    with tarfile.open(work / ".bundles" / "probe.tar.xz", "w:xz") as tar:
        tar.add(site, arcname=".")
    with zipfile.ZipFile(work / ".whl" / "probe_wheel-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("probe_wheel.py", "NAME = 'wheel'\n")
        whl.writestr("probe_wheel-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: probe-wheel\nVersion: 1.0\n")
        whl.writestr(
            "probe_wheel-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr("probe_wheel-1.0.dist-info/RECORD", "")
    (work / "probe.py").write_text(
        "import sys, probe_bundle, probe_dsl, probe_wheel\n"
        "open(sys.argv[1], 'w').write(' '.join(m.NAME for m in (probe_bundle, probe_dsl, probe_wheel)))\n"
    )
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "TMPDIR": str(tmp_path / "host-tmp"),
        "LONGCA_GPU_BENCH": "probe.py {out}/probe.txt",
    }
    (tmp_path / "host-tmp").mkdir()
    # a limit of 45 s leaves no time for cells: the call sets up, runs the probe, and returns
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu-host.sh"), str(out), str(ROOT / "specs" / "default.yaml"), "45"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (out / "probe.txt").read_text() == "bundle dsl wheel", (out / "bench.log").read_text()


def test_a_run_into_another_folder_returns_that_folders_aggregate(tmp_path: Path) -> None:
    # A re-run check (`--results DIR --sample N`) is a set of its own: the committed cells are not
    # restored into it (here they could not be: the aggregate is unreadable, which would stop a
    # normal call), and OUTDIR gets the aggregate of DIR, since cell files under OUTDIR nest too
    # deep to come back from a lent machine.
    import pyarrow.parquet as pq

    work = tmp_path / "tree"
    (work / "results" / "default").mkdir(parents=True)
    (work / "results" / "default" / "all.parquet").write_bytes(b"not parquet")
    (work / "longca").symlink_to(ROOT / "longca")
    out = tmp_path / "out"
    rerun = tmp_path / "rerun"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    args = [
        "--results",
        str(rerun),
        "--sample",
        "2",
        "--sweep",
        "dense",
        "--only",
        "kernel=naive",
        "--only",
        "seqlen=256",
    ]
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "gpu-host.sh"), str(out), str(ROOT / "specs" / "default.yaml"), "150", *args],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not (work / "results" / "default" / "cells").exists()
    assert len(list((rerun / "default" / "cells").rglob("*.parquet"))) == 2
    table = pq.read_table(out / "default.parquet", columns=["kernel", "seqlen_q", "cell_digest"])
    assert set(table.column("kernel").to_pylist()) == {"naive"}
    assert set(table.column("seqlen_q").to_pylist()) == {256}
    assert len(set(table.column("cell_digest").to_pylist())) == 2

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

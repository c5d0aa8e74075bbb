import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

"""Helpers for tests that run the real Snakemake in a temporary copy of the workflow."""

ROOT = Path(__file__).resolve().parents[2]


def copy_workflow(dest: Path) -> Path:
    """Snakefile, rules, schemas and profiles copied (links resolved) into `dest`."""
    for name in ("Snakefile", "workflow", "profiles"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=False)
        else:
            shutil.copy(src, dest / name)
    (dest / "specs").mkdir(exist_ok=True)
    return dest


def snakemake(workdir: Path, spec: str, *extra: str, timeout: int = 600, check: bool = True):
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", "--config", f"spec={spec}", *extra]
    proc = subprocess.run(
        cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def jobs_run(proc) -> list[str]:
    """Rule names of the jobs Snakemake ran, from its progress lines ("Finished jobid: N (Rule: name)")."""
    return re.findall(r"\(Rule: ([A-Za-z0-9_]+)\)", proc.stdout + proc.stderr)

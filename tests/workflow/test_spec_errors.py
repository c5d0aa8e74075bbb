"""A bad spec gets one message, the same through every entry point (`longca validate`, `longca run`,
`longca plan`, the Snakefile), with exit status 2, before any process or job starts."""

import subprocess
import sys

import pytest

BAD = {
    "a key typo": "name: x\ndevice: cpu\nkernal: [naive]\n",
    "a YAML error": "name: [x\n",
    "an unknown kernel": "name: x\ndevice: cpu\nkernels: [nave]\nmasks: [full]\nseqlens: [64]\nsweeps: [{name: s}]\n",
}


def _entry_points(spec: str) -> dict[str, list[str]]:
    longca = [sys.executable, "-m", "longca.cli"]
    return {
        "longca validate": [*longca, "validate", spec],
        "longca run": [*longca, "run", "--spec", spec],
        "longca plan": [*longca, "plan", spec],
        "snakemake": [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--config", f"spec={spec}"],
    }


@pytest.mark.parametrize("what", [*BAD, "a missing file"])
def test_every_entry_point_reports_a_bad_spec_in_one_same_line(tmp_path, copy_workflow, what):
    work = copy_workflow(tmp_path / "repo")
    spec = tmp_path / "spec.yaml"
    if what in BAD:
        spec.write_text(BAD[what])
    lines = {}
    for name, cmd in _entry_points(str(spec)).items():
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, (name, proc.stderr[-2000:])
        errors = [line for line in proc.stderr.splitlines() if line.startswith("longca: error: ")]
        assert len(errors) == 1, (name, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr and len(proc.stderr) < 2000, (name, proc.stderr[-2000:])
        lines[name] = errors[0]
    assert len(set(lines.values())) == 1, lines
    assert "spec field" in lines["longca validate"]
    assert not (work / "results").exists()  # nothing ran

"""benchmarks/eager_gap.py: its arguments are checked before any GPU work (the loops need CUDA)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports timer_fidelity as its neighbour
_spec = importlib.util.spec_from_file_location("eager_gap", ROOT / "benchmarks" / "eager_gap.py")
eg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eg)
sys.path.remove(str(ROOT / "benchmarks"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sweep", "dens"], r"--sweep 'dens': no such sweep in 'h200'; allowed: dense"),
        (["--sweep", "dense", "--kernel", "fa5"], r"--kernels 'fa5': unknown fa5; allowed: .*\bfa4\b"),
        (["--sweep", "dense", "--passes", "back"], r"--passes 'back': allowed: fwd, bwd"),
        (["--sweep", "dense", "--seqlen", "1Q"], r"--seqlen"),
        (["--sweep", "dense", "--masks", "causal,sliding"], r"--masks 'causal,sliding': allowed: full, causal"),
    ],
)
def test_bad_arguments_name_the_field_and_what_is_allowed(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "gap.jsonl"
    with pytest.raises((SystemExit, ValueError), match=message):
        eg.main([str(out), "--spec", str(ROOT / "specs" / "h200.yaml"), *args])
    assert not out.exists()  # nothing opened, no GPU touched


def test_python_probe_times_a_fixed_loop_on_the_cpu() -> None:
    # the CPU-speed probe needs no GPU: a fixed loop's time per step, positive and far under 10 us
    assert 0 < eg.python_ns(20_000) < 10_000

"""benchmarks/timer_fidelity.py: which repeat protocol longca's timer runs under (the timing itself needs a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from longca.spec.cells import expand
from longca.spec.load import load_spec

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("timer_fidelity", ROOT / "benchmarks" / "timer_fidelity.py")
tf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tf)


def test_the_dense_sweeps_protocol_is_what_its_cells_are_timed_under() -> None:
    rep = tf.sweep_protocol(str(ROOT / "specs" / "h200.yaml"), "dense")
    cells = [c for c in expand(load_spec(ROOT / "specs" / "h200.yaml")) if c.sweep == "dense"]
    assert all(c.repeat_dict == rep for c in cells)
    assert rep["warmup_s"] == 0.05 and rep["budget_s"] == 2.0 and rep["iters"] == 1000 and rep["l2_flush"] is True


def test_the_default_protocol_is_the_fixed_one_of_the_earlier_checks() -> None:
    assert tf.FIXED == {"warmup": 5, "iters": 20, "min_iters": 20, "budget_s": 60.0, "l2_flush": True}


def test_an_unknown_sweep_names_the_allowed_ones() -> None:
    with pytest.raises(
        SystemExit, match=r"--sweep 'dens': no such sweep in 'h200'; allowed: dense, dense_baselines, linear"
    ):
        tf.sweep_protocol(str(ROOT / "specs" / "h200.yaml"), "dens")


def test_a_sweep_without_single_gpu_cells_has_no_protocol(tmp_path: Path) -> None:
    spec = tmp_path / "two.yaml"
    spec.write_text("""\
name: two
device: cpu
repeat: {warmup: 1, iters: 3, min_iters: 1, budget_s: 0.5, l2_flush: false}
heads: ["2:2"]
head_dims: [16]
dtypes: [float32]
passes: [fwd]
sweeps:
  - name: mixed
    kernels: [naive]
    masks: [full]
    seqlens: [64]
  - name: mixed_cp
    kernels: [naive]
    masks: [causal]
    seqlens: [64]
    cp: {mechanisms: [ring_p2p], world_sizes: [2], backend: gloo}
""")
    assert tf.sweep_protocol(str(spec), "mixed")["iters"] == 3
    with pytest.raises(SystemExit, match="--sweep 'mixed_cp': no single-GPU cells"):
        tf.sweep_protocol(str(spec), "mixed_cp")  # CP cells only: nothing for a single-GPU timer


def test_kernels_are_picked_by_name_and_typos_name_the_allowed_ones() -> None:
    assert tf.fidelity_kernels("fa4") == ("fa4",)
    assert tf.fidelity_kernels("sdpa_cudnn, fa4") == ("sdpa_cudnn", "fa4")
    with pytest.raises(SystemExit, match=r"--kernels 'fa5': unknown fa5; allowed: .*\bfa4\b.*\bsdpa_cudnn\b"):
        tf.fidelity_kernels("fa5")
    with pytest.raises(SystemExit, match=r"unknown \(none given\)"):
        tf.fidelity_kernels(",")

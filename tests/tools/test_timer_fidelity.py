"""benchmarks/timer_fidelity.py: which repeat protocol longca's timer runs under (the timing itself needs a GPU)."""

from __future__ import annotations

import importlib.util
import json
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


def test_forward_and_backward_cases_are_timed_and_saved_as_parquet(tmp_path: Path) -> None:
    """The plumbing on the CPU, with a plain loop standing in for do_bench (which needs CUDA): each
    case times what its pass says, a backward with gradients cleared before each call."""
    import statistics
    import time

    import polars as pl
    import torch

    calls = {"bench": 0}

    def bench(fn, warmup_ms, rep_ms, grad_to_none):
        calls["bench"] += 1
        times = []
        for _ in range(3):
            for x in grad_to_none or ():
                x.grad = None
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    out = tmp_path / "cpu-fidelity.parquet"
    rep = {"warmup": 1, "iters": 3, "min_iters": 3, "budget_s": 1.0, "l2_flush": False}
    rows = tf.main(str(out), 1, rep, ("sdpa_math",), (16,), ("fwd", "bwd"), torch.device("cpu"), bench)
    assert len(rows) == 8 and calls["bench"] == 16  # 2 masks x 2 head layouts x 2 passes; default + matched
    assert all("error" not in r for r in rows), [r.get("error") for r in rows]
    table = pl.read_parquet(out)
    assert table.height == 8 and set(table["pass"]) == {"fwd", "bwd"}
    assert (table["longca_median_ms"] > 0).all() and (table["timed_iters"].list.first() == 3).all()
    assert json.loads(table["protocol"][0]) == rep


def test_unknown_passes_are_named() -> None:
    with pytest.raises(SystemExit, match="--passes 'fwd,bwdd': allowed: fwd, bwd"):
        tf.fidelity_passes("fwd,bwdd")


def test_a_backward_case_runs_on_one_retained_graph_and_before_clears_its_gradients() -> None:
    """`make_call` (also benchmarks/eager_gap.py's): every call a backward on the same forward's
    graph, gradients accumulating unless `before` clears them."""
    import torch

    from longca.masks.registry import build_mask

    fn, before, grads = tf.make_call(
        "sdpa_math", build_mask("causal", 16), (2, 1), "bwd", torch.device("cpu"), torch.float32
    )
    fn()
    first = [g.grad.clone() for g in grads]
    fn()  # the retained graph runs again: without `before` the gradients add up
    assert all(torch.allclose(g.grad, 2 * f) for g, f in zip(grads, first))
    before()
    assert all(g.grad is None for g in grads)
    fn()
    assert all(torch.allclose(g.grad, f) for g, f in zip(grads, first))
    fwd, no_before, no_grads = tf.make_call(
        "sdpa_math", build_mask("full", 16), (2, 2), "fwd", torch.device("cpu"), torch.float32
    )
    assert no_before is None and no_grads is None and fwd().shape[-1] == 128

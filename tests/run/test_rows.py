"""The one row builder (longca.run.rows): status classification of failures, the timing and
throughput columns against hand-worked numbers, and the terminal line of a cell."""

from __future__ import annotations

import json
import math

import pytest
import torch

from longca.kernels.base import Unsupported
from longca.masks.registry import build_mask
from longca.measure.timer import Timing
from longca.run import rows
from longca.spec.cells import expand
from longca.spec.load import load_spec

SPEC = """
name: t
device: cpu
repeat: {warmup: 1, iters: 3, min_iters: 1, budget_s: 0.2, l2_flush: false}
masks: [full, {name: sliding_window, window: 16}]
seqlens: [64, 3072, 2097152]
heads: ["4:2"]
head_dims: [16]
dtypes: [float32]
passes: [fwd, bwd]
batch: [2]
sweeps: [{name: s, kernels: [sdpa_math]}]
"""

CP_SPEC = """
name: tcp
device: cpu
repeat: {warmup: 1, iters: 3, min_iters: 1, budget_s: 0.2, l2_flush: false}
masks: [causal]
seqlens: [64]
heads: ["4:4"]
head_dims: [16]
dtypes: [float32]
passes: [fwd]
sweeps:
  - {name: cp, kernels: [naive],
     cp: {mechanisms: [usp], world_sizes: [4], backend: gloo, balance: zigzag, ulysses_degrees: [2]}}
"""


def _cells(text: str = SPEC):
    return expand(load_spec(text=text))


def _cell(seqlen: int = 64, mask: str = "full", pass_: str = "fwd"):
    return next(c for c in _cells() if c.seqlen == seqlen and c.mask == mask and c.pass_ == pass_)


# --- classification -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "exc, status",
    [
        (Unsupported("head_dim 17 not served"), "unsupported"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        # CUDA's message wrapped in a RuntimeError (an adapter or library re-raising it)
        (RuntimeError("CUDA error: out of memory"), "oom"),
        (RuntimeError("Out Of Memory while allocating workspace"), "oom"),
        (RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"), "oom"),
        (RuntimeError("No available kernel. Aborting execution."), "unsupported"),
        (RuntimeError("no available kernel"), "error"),  # only the exact phrase SDPA uses
        (ValueError("shape mismatch"), "error"),
        (RuntimeError(), "error"),
    ],
)
def test_classify_names_the_status_of_each_failure(exc, status):
    assert rows.classify(exc)[0] == status


def test_classify_reasons_are_the_first_line_with_the_type_and_at_most_500_characters():
    assert rows.classify(ValueError("shape mismatch\nsecond line")) == ("error", "ValueError: shape mismatch")
    assert rows.classify(RuntimeError()) == ("error", "RuntimeError:")
    long = rows.classify(RuntimeError("x" * 900))[1]
    assert len(long) == 500 and long.startswith("RuntimeError: xxx")
    oom = rows.classify(torch.OutOfMemoryError("CUDA out of memory.\nTried to allocate 2 GiB"))
    assert oom == ("oom", "OutOfMemoryError: CUDA out of memory.")
    # an unsupported cell keeps its whole reason (without the type), up to 500 characters
    assert rows.classify(Unsupported("a\nb")) == ("unsupported", "a\nb")
    assert rows.classify(Unsupported("y" * 700))[1] == "y" * 500


# --- timing and throughput columns ---------------------------------------------------------------


def test_timing_columns_against_hand_worked_throughput():
    timing = Timing(
        samples_ms=[2.0, 4.0, 3.0, 5.0, 1.0, 6.0, 3.5],
        warmup_iters=2,
        timed_iters=7,
        timer="cuda_event",
        l2_flush=True,
        warmup_wall_s=0.25,
        wall_s=1.5,
        ci_target=0.02,
    )
    cols = rows.timing_columns(timing, flops=4e12, tokens=8192, world=2)
    # median of 1, 2, 3, 3.5, 4, 5, 6 is 3.5 ms; 7 samples cover 95% only with the full range
    assert cols["median_ms"] == 3.5
    assert (cols["ci_low_ms"], cols["ci_high_ms"]) == (1.0, 6.0)
    assert cols["tflops"] == pytest.approx(4e12 / (3.5e-3 * 2) / 1e12)  # per GPU: 571.43
    assert cols["tokens_per_s"] == pytest.approx(8192 / 3.5e-3)
    assert cols["ci_met"] is False  # a +-71% interval misses +-2%
    assert cols["ci_target"] == 0.02
    assert (cols["warmup_iters"], cols["timed_iters"], cols["timer"], cols["l2_flush"]) == (2, 7, "cuda_event", True)
    assert (cols["warmup_s"], cols["timer_wall_s"], cols["flops"]) == (0.25, 1.5, 4e12)
    assert cols["samples_ms"] == timing.samples_ms and cols["flop_model"] == "softmax_exact_area"
    assert cols["p20_ms"] <= cols["median_ms"] <= cols["p80_ms"]
    single = rows.timing_columns(timing, flops=4e12, tokens=8192)
    assert single["tflops"] == pytest.approx(2 * cols["tflops"])


def test_softmax_flops_is_the_forward_and_backward_model_of_the_cell():
    # forward: 4 * area * heads_q * head_dim; backward 2.5 times that (5 matrix products of 2)
    assert rows.softmax_flops(1000.0, _cell(pass_="fwd")) == 4 * 1000 * 4 * 16
    assert rows.softmax_flops(1000.0, _cell(pass_="bwd")) == 2.5 * 4 * 1000 * 4 * 16


def test_gate_peak_turns_an_impossible_throughput_into_an_error():
    device = torch.device("cpu")
    row = {"dtype": "float32", "tflops": 1e9, "status": "ok", "reason": None}
    rows.gate_peak(row, device)
    assert row["status"] == "error" and "above the device peak" in row["reason"]
    fine = {"dtype": "float32", "tflops": 1e-6, "status": "ok", "reason": None}
    rows.gate_peak(fine, device)
    assert fine["status"] == "ok" and fine["reason"] is None
    missing = {"dtype": "float32", "tflops": None, "status": "ok", "reason": None}
    rows.gate_peak(missing, device)
    assert missing["status"] == "ok"


# --- identity columns -----------------------------------------------------------------------------


def test_cell_columns_carry_the_cells_identity_shape_and_mask():
    cell = _cell(seqlen=3072, mask="sliding_window", pass_="bwd")
    cols = rows.cell_columns(cell)
    assert cols["cell_digest"] == cell.digest and cols["cell_id"] == cell.id
    assert (cols["spec"], cols["sweep"], cols["kernel"], cols["pass"]) == ("t", cell.sweep, "sdpa_math", "bwd")
    assert (cols["batch"], cols["seqlen_q"], cols["seqlen_k"]) == (2, 3072, 3072)
    assert (cols["heads_q"], cols["heads_kv"], cols["head_dim"], cols["head_dim_v"]) == (4, 2, 16, 16)
    assert (cols["dtype"], cols["mask"], cols["mask_family"]) == ("float32", "sliding_window", "regular")
    assert json.loads(cols["mask_params"]) == {"window": 16}
    assert cols["mask_variant"] == cell.mask_variant != "default"
    assert (cols["seed"], cols["mask_samples"], cols["world_size"]) == (cell.seed, cell.samples, 1)
    assert cols["cp_mechanism"] is cols["cp_degrees"] is cols["cp_variant"] is cols["cp_balance"] is None


def test_a_cp_cells_columns_name_its_resolved_degrees_and_layout():
    (cell,) = _cells(CP_SPEC)
    cols = rows.cell_columns(cell)
    assert json.loads(cols["cp_degrees"]) == {"ulysses": 2, "ring": 2, "windows": 1}
    assert (cols["cp_mechanism"], cols["cp_balance"], cols["world_size"]) == ("usp", "zigzag", 4)
    row = rows.status_row(cell, "timeout", "ran past 300 s", timeout_s=300)
    assert (row["status"], row["reason"], row["timeout_s"]) == ("timeout", "ran past 300 s", 300)
    assert row["layout"] == "bhsd" and row["device_count"] == 4 and row["mask_form"] == "slices"
    assert row["run_id"] == rows.RUN_ID and row["kernel_family"]


def test_a_single_device_rows_layout_is_the_kernels_own():
    row = rows.base_row(_cell())
    assert row["layout"] == "bhsd" and "mask_form" not in row and "device_count" in row
    with pytest.raises(ValueError):
        rows.status_row(_cell(), "finished", None)  # not a status


def test_mask_columns_of_a_drawn_mask():
    mask = build_mask("full_document", 256, params={}, seed=3)
    cols = rows.mask_columns(mask, sample=2)
    assert cols["mask_sample"] == 2 and cols["density"] == mask.density
    assert cols["num_documents"] == len(mask.documents) >= 1
    assert "block_size" not in cols
    sparse = build_mask("block_sparse", 256, params={"block": 64, "density": 0.5}, seed=1)
    scols = rows.mask_columns(sparse, sample=0)
    assert (scols["block_size"], scols["variable_blocks"], scols["num_documents"]) == (64, False, None)
    assert scols["score_source"] == sparse.params.get("score")


# --- the terminal line ------------------------------------------------------------------------------


def test_summarize_gives_the_median_over_rows_or_the_first_reason_line():
    ok = [{"status": "ok", "median_ms": m, "tflops": t} for m, t in ((1.0, 10.0), (3.0, 30.0), (2.0, 20.0))]
    assert rows.summarize(ok) == "ok 2.000 ms 20.0 TFLOP/s"
    assert rows.summarize([{"status": "oom", "reason": "\n  CUDA out of memory.\nmore"}]) == "oom: CUDA out of memory."
    assert rows.summarize([{"status": "error", "reason": None}]) == "error: None"


def test_cell_line_names_the_cell_and_its_place_within_150_characters():
    cell = _cell(seqlen=3072, mask="sliding_window", pass_="bwd")
    line = rows.cell_line(cell, "ok  1.000 ms\n 2 TFLOP/s", progress=(3, 12))
    assert (
        line
        == f"[longca] 3/12 sdpa_math sliding_window({cell.mask_variant}) 3K 4:2 d16 float32 bwd: ok 1.000 ms 2 TFLOP/s"
    )
    assert rows.cell_line(_cell(), "ok").startswith("[longca] sdpa_math full 64 4:2 d16 float32 fwd: ok")
    two_m = next(c for c in _cells() if c.seqlen == 2097152)
    assert " 2M " in rows.cell_line(two_m, "ok")
    (cp,) = _cells(CP_SPEC)
    assert rows.cell_line(cp, "ok").endswith("fwd usp x4: ok") and "naive causal 64 4:4" in rows.cell_line(cp, "ok")
    long = rows.cell_line(cell, "error: " + "z" * 400)
    assert len(long) == rows.LINE_MAX and long.endswith("...")


def test_clip_line_keeps_lines_up_to_the_limit_whole():
    exact = "a" * rows.LINE_MAX
    assert rows.clip_line(exact) == exact
    over = rows.clip_line(exact + "b")
    assert len(over) == rows.LINE_MAX and over == "a" * (rows.LINE_MAX - 3) + "..."


def test_place_counts_from_one_after_the_cells_before():
    assert rows.place(before=4, index=0, total=10) == (5, 10)
    assert rows.place(before=4, index=2, total=10) == (7, 10)
    assert rows.place(before=0, index=0, total=0) is None


def test_no_reason_is_lost_to_nan_tflops():
    timing = Timing(samples_ms=[1.0] * 6, warmup_iters=0, timed_iters=6, timer="wall", l2_flush=False)
    cols = rows.timing_columns(timing, flops=0.0, tokens=1)
    assert cols["tflops"] == 0.0 and not math.isnan(cols["tokens_per_s"]) and cols["ci_met"] is None

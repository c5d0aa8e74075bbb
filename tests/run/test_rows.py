"""The one row builder (longca.run.rows): status classification of failures, the timing and
throughput columns against hand-worked numbers, and the terminal line of a cell."""

from __future__ import annotations

import json
import math
from datetime import datetime

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


def test_identity_columns_exactly():
    cell = _cell(seqlen=3072, mask="sliding_window", pass_="bwd")
    assert rows.cell_columns(cell) == {
        "spec": "t",
        "sweep": "s",
        "cell_id": cell.id,
        "cell_digest": cell.digest,
        "kernel": "sdpa_math",
        "pass": "bwd",
        "batch": 2,
        "seqlen_q": 3072,
        "seqlen_k": 3072,
        "heads_q": 4,
        "heads_kv": 2,
        "head_dim": 16,
        "head_dim_v": 16,
        "dtype": "float32",
        "mask": "sliding_window",
        "mask_family": "regular",
        "mask_variant": cell.mask_variant,
        "mask_params": '{"window": 16}',
        "seed": 0,
        "mask_samples": 1,
        "world_size": 1,
        "cp_mechanism": None,
        "cp_variant": None,
        "cp_degrees": None,
        "cp_balance": None,
    }
    (cp,) = _cells(CP_SPEC)
    assert rows.cell_columns(cp)["cp_degrees"] == '{"ring": 2, "ulysses": 2, "windows": 1}'  # keys sorted


def test_degrees_that_do_not_resolve_are_kept_as_given_with_sorted_keys():
    import dataclasses

    (cp,) = _cells(CP_SPEC)
    odd = dataclasses.replace(cp, cp_degrees=(("windows", 3), ("ulysses", 3)))  # 3 x 3 is not 4
    assert rows.cell_columns(odd)["cp_degrees"] == '{"ulysses": 3, "windows": 3}'


def test_mask_params_json_has_sorted_keys():
    import dataclasses

    cell = dataclasses.replace(_cell(), mask="block_sparse", mask_params=(("score", "random"), ("block", 64)))
    cols = rows.cell_columns(cell)
    assert cols["mask_params"] == '{"block": 64, "score": "random"}' and cols["mask_family"] == "dynamic"
    unknown = dataclasses.replace(_cell(), mask="not_a_mask")
    assert rows.cell_columns(unknown)["mask_family"] is None


def test_base_row_has_the_environment_of_the_device_that_runs_it(monkeypatch):
    import dataclasses

    from longca.measure.env import environment

    row = rows.base_row(_cell())
    assert isinstance(row["timestamp"], datetime) and row["timestamp"].tzinfo is not None
    assert row["device_name"] == environment("cpu")["device_name"]
    # a CUDA cell recorded on a machine without CUDA (a planned refusal) carries the host's facts
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cuda_row = rows.base_row(dataclasses.replace(_cell(), device="cuda"))
    assert cuda_row["device_name"] == environment("cpu")["device_name"]
    unknown = rows.base_row(dataclasses.replace(_cell(), kernel="no_such_kernel"))
    assert "layout" not in unknown and "kernel_family" not in unknown


def test_a_cp_block_sparse_cell_names_its_mask_form():
    import dataclasses

    (cp,) = _cells(CP_SPEC)
    sparse = dataclasses.replace(cp, mask="block_sparse", mask_params=(("block", 16),))
    assert rows.base_row(sparse)["mask_form"] == "block_sparse"


def test_mask_columns_exactly():
    mask = build_mask("variable_block_sparse", 1024, {"min_block": 64, "mean_block": 128}, seed=2)
    cols = rows.mask_columns(mask, sample=1)
    assert cols["variable_blocks"] is True and cols["block_size"] is None
    assert cols["mask_params"] == json.dumps(mask.params, sort_keys=True, default=str)
    assert list(json.loads(cols["mask_params"])) == sorted(mask.params)
    doc = build_mask("full_document", 256, {}, seed=3)
    dcols = rows.mask_columns(doc, sample=0)
    assert set(dcols) == {"mask_sample", "density", "num_documents", "distribution", "mask_params"}
    assert dcols["distribution"] == doc.params["distribution"] is not None


def test_throughput_to_the_last_digit():
    timing = Timing(samples_ms=[2.0] * 6, warmup_iters=0, timed_iters=6, timer="cuda_event", l2_flush=True)
    # 2e12 FLOPs in 2 ms: exactly 1000 TFLOP/s
    assert rows.timing_columns(timing, flops=2e12, tokens=1)["tflops"] == 1000.0


def test_the_peak_gate_at_the_peak_itself(monkeypatch):
    monkeypatch.setattr(rows, "peak_tflops", lambda device, name, dtype: (100.0, f"table for {name} {dtype}"))
    at = {"dtype": "bfloat16", "tflops": 100.0, "status": "ok", "reason": None}
    rows.gate_peak(at, torch.device("cpu"))
    assert at["status"] == "ok"  # reaching the peak is possible; passing it is not
    over = {"dtype": "bfloat16", "tflops": 100.5, "status": "ok", "reason": None}
    rows.gate_peak(over, torch.device("cpu"))
    from longca.measure.env import environment

    name = environment("cpu")["device_name"]
    assert over["reason"] == (
        f"throughput 100.5 TFLOP/s above the device peak 100.0 (table for {name} bfloat16): "
        "a measurement or FLOP-count bug, not a result"
    )


def test_a_reason_of_blank_lines_summarises_to_nothing():
    assert rows.summarize([{"status": "error", "reason": "\n \n"}]) == "error: "


def test_lengths_in_the_terminal_line():
    import dataclasses

    cell = _cell()
    for n, text in ((1024, "1K"), (1536, "1536"), (1 << 20, "1M"), (3 << 20, "3M"), (1000, "1000"), (512, "512")):
        assert f" {text} " in rows.cell_line(dataclasses.replace(cell, seqlen=n), "ok")


def test_a_rows_environment_is_of_the_device_that_runs_it(monkeypatch):
    import dataclasses

    monkeypatch.setattr(rows, "environment", lambda device: {"device": device, "device_name": f"name of {device}"})
    cpu = rows.base_row(_cell())
    assert (cpu["device"], cpu["device_name"]) == ("cpu", "name of cpu")
    cuda_cell = dataclasses.replace(_cell(), device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert rows.base_row(cuda_cell)["device"] == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rows.base_row(cuda_cell)["device"] == "cpu"  # a refusal recorded where there is no GPU
    seen = []
    monkeypatch.setattr(rows, "peak_tflops", lambda device, name, dtype: (seen.append(name), (1e9, "t"))[1])
    rows.gate_peak({"dtype": "float32", "tflops": 1.0, "status": "ok", "reason": None}, torch.device("cpu"))
    assert seen == ["name of cpu"]


def test_a_single_device_row_has_its_kernels_layout_and_a_cp_row_bhsd():
    import dataclasses

    fa4 = dataclasses.replace(_cell(), kernel="fa4")  # a bshd kernel (registered whether or not installed)
    assert rows.base_row(fa4)["layout"] == "bshd"
    (cp,) = _cells(CP_SPEC)
    assert rows.base_row(dataclasses.replace(cp, kernel="fa4"))["layout"] == "bhsd"  # CP ranks take (B, H, S, D)


def test_mask_params_that_json_cannot_hold_are_written_as_text():
    import dataclasses

    import numpy as np

    mask = build_mask("full", 16)
    odd = dataclasses.replace(mask, params={"count": np.int64(3), "b": 1})
    assert rows.mask_columns(odd, 0)["mask_params"] == '{"b": 1, "count": "3"}'

"""Fault isolation: crashes, hangs, exceptions and OOMs in one cell never cost another cell."""

from pathlib import Path

import pyarrow.parquet as pq

from longca.run.chunk import run_chunk
from longca.spec.cells import expand
from longca.spec.load import load_spec

SPEC = """
name: faults
device: cpu
repeat: {warmup: 0, iters: 2, min_iters: 1, budget_s: 0.1, l2_flush: false}
check: {max_seqlen: 128}
timeout_s: 4
kernels: [naive, test_raise, test_oom, test_hang, test_segfault]
masks: [full]
seqlens: [192]
heads: ["2:2"]
head_dims: [16]
dtypes: [float32]
passes: [fwd]
sweeps: [{name: s}]
"""


def test_every_fault_ends_as_its_row(tmp_path, plugin_env, monkeypatch):
    import longca.run.chunk as chunk

    # Start-up grace applies to a fresh worker's first cell only; the hang is not a first cell (the
    # exceptions before it do not end their worker), so it costs its own 4 s, and a slow start of
    # the workers after the hang and the crash cannot time out (with the hang first in its worker
    # and 20 s of grace, the next worker once took longer than 24 s to finish a raising cell).
    monkeypatch.setattr(chunk, "GRACE_S", 60.0)
    path = tmp_path / "faults.yaml"
    path.write_text(SPEC)
    cells = expand(load_spec(path))
    # Put the good kernel last: it must still run after every kind of failure before it.
    cells = sorted(cells, key=lambda c: c.kernel == "naive")
    assert [c.kernel for c in cells] == ["test_raise", "test_oom", "test_hang", "test_segfault", "naive"]
    outputs = [c.output(tmp_path / "results") for c in cells]
    run_chunk(load_spec(path), outputs, str(tmp_path / "results"))
    status = {}
    for c, o in zip(cells, outputs):
        t = pq.read_table(o).to_pylist()
        assert len(t) == 1
        status[c.kernel] = (t[0]["status"], t[0]["reason"] or "")
    assert status["naive"][0] == "ok"
    assert status["test_segfault"][0] == "error" and "SIGSEGV" in status["test_segfault"][1]
    assert status["test_hang"][0] == "timeout" and "time limit" in status["test_hang"][1]
    assert status["test_raise"][0] == "error" and "deliberate failure" in status["test_raise"][1]
    assert status["test_oom"][0] == "oom"


def test_stopped_chunk_streams_the_worker_log(tmp_path, plugin_env, stopped_chunk):
    import os
    import signal

    path = tmp_path / "faults.yaml"
    path.write_text(SPEC.replace("timeout_s: 4", "timeout_s: 120"))
    by_kernel = {c.kernel: c for c in expand(load_spec(path))}
    cells = [by_kernel["naive"], by_kernel["test_hang"]]  # the good cell, then one that never ends
    outputs = [str(c.output(tmp_path / "results")) for c in cells]
    # settle_s: the supervisor copies the worker's log at least every 5 s
    code, err = stopped_chunk(path, outputs, tmp_path / "results", lambda: os.path.exists(outputs[0]), settle_s=6)
    assert code == 128 + signal.SIGTERM
    # The worker never ended, yet its line for the finished cell reached the chunk's stderr.
    from longca.run.rows import cell_line

    assert cell_line(cells[0], "ok", (1, 2)) + " " in err, err[-2000:]


def test_a_cells_line_is_short_and_says_what_ran_and_how_it_ended(plugin_env):
    from longca.run.rows import LINE_MAX, cell_line

    cell = expand(load_spec(text=SPEC))[0]
    reason = "unsupported: mask causal_document offers forms " + "['slices', 'dense'] " * 40 + "\nsecond line"
    line = cell_line(cell, reason, (3, 40))
    assert line.startswith(f"[longca] 3/40 {cell.kernel} full 192 2:2 d16 float32 fwd: unsupported: mask")
    assert len(line) == LINE_MAX and line.endswith("...") and "\n" not in line
    assert (
        cell_line(cell, "ok 1.000 ms 2.0 TFLOP/s")
        == f"[longca] {cell.kernel} full 192 2:2 d16 float32 fwd: ok 1.000 ms 2.0 TFLOP/s"
    )


def _sampled_spec(tmp_path, kernels: str, draws: int, timeout_s: float):
    """SPEC on causal_document (a sampled mask) with `draws` draws, these kernels and time limit."""
    path = tmp_path / "sampled.yaml"
    path.write_text(
        SPEC.replace("kernels: [naive, test_raise, test_oom, test_hang, test_segfault]", f"kernels: {kernels}")
        .replace("masks: [full]", "masks: [causal_document]")
        .replace("timeout_s: 4", f"timeout_s: {timeout_s}\nmask_samples: {{multi_document: {draws}, single: 1}}")
    )
    return load_spec(path)


def test_a_worker_takes_the_draws_a_stopped_run_kept_and_removes_them_with_the_cell_written(tmp_path):
    from longca.run.cell import run_cell
    from longca.store.draws import SUFFIX, save_draw

    spec = _sampled_spec(tmp_path, "[naive]", draws=2, timeout_s=120)
    (cell,) = expand(spec)
    assert cell.samples == 2
    out = Path(cell.output(tmp_path / "results"))
    # draw 0 as a stopped run kept it (its samples marked, so the cell file shows which row it is)
    kept = dict(run_cell(cell)[0], samples_ms=[123.0], median_ms=123.0)
    save_draw(out, 0, kept)
    run_chunk(spec, [str(out)], str(tmp_path / "results"))
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: r["mask_sample"])
    assert [r["mask_sample"] for r in rows] == [0, 1] and {r["status"] for r in rows} == {"ok"}
    assert rows[0]["samples_ms"] == [123.0] and rows[1]["samples_ms"] != [123.0]
    assert not list(out.parent.glob(f"*{SUFFIX}"))  # the cell is written: its draw files are gone


def test_the_time_limit_bounds_one_draw_of_a_sampled_mask_not_the_whole_cell(tmp_path, plugin_env):
    # Four draws of about 1 s each (one 1 s call) under a 3 s limit: every draw finishes well inside it
    # (a 3x margin for a loaded machine), the cell does not. A finished draw is progress, so the cell
    # ends ok (a hung call still times out: test_every_fault_ends_as_its_row).
    spec = _sampled_spec(tmp_path, "[naive, test_slow]", draws=4, timeout_s=3)
    # the slow cell second in its worker: the first cell's start-up allowance does not cover it
    cells = sorted(expand(spec), key=lambda c: c.kernel == "test_slow")
    outputs = [c.output(tmp_path / "results") for c in cells]
    run_chunk(spec, outputs, str(tmp_path / "results"))
    rows = pq.read_table(outputs[1]).to_pylist()
    assert [r["status"] for r in rows] == ["ok"] * 4, rows[0]["reason"]
    assert rows[0]["cell_wall_s"] > 3.0  # longer than the limit as a whole


# `gpu_model`: a run on another GPU model, or on no GPU, stops before any cell file is written.

CUDA_SPEC = SPEC.replace("device: cpu", "device: cuda\ngpu_model: H200").replace(
    "kernels: [naive, test_raise, test_oom, test_hang, test_segfault]", "kernels: [naive]"
)


def test_a_run_on_another_gpu_model_stops_before_any_cell_file(tmp_path, monkeypatch):
    import pytest

    import longca.run.chunk as chunk
    from longca.spec.load import SpecError

    spec = load_spec(text=CUDA_SPEC)
    outputs = [c.output(tmp_path / "results") for c in expand(spec)]
    for names, words in [
        (["NVIDIA H200", "NVIDIA H100 80GB HBM3"], ["'H200' is not in", "['NVIDIA H100 80GB HBM3']", "one GPU model"]),
        ([], ["no CUDA GPU", "run this spec on a machine with H200 GPUs"]),
    ]:
        monkeypatch.setattr(chunk, "gpu_names", lambda names=names: names)
        with pytest.raises(SpecError) as info:
            run_chunk(spec, outputs, str(tmp_path / "results"))
        assert info.value.field == "gpu_model"
        for word in words:
            assert word in str(info.value), str(info.value)
    assert not (tmp_path / "results").exists()


def test_the_gpu_model_check_takes_the_named_model_and_ignores_unnamed_specs():
    from longca.run.chunk import check_gpu_model

    spec = load_spec(text=CUDA_SPEC)
    check_gpu_model(spec, ["NVIDIA H200", "NVIDIA H200 NVL"])  # a substring, any case
    check_gpu_model(load_spec(text=CUDA_SPEC.replace("gpu_model: H200", "gpu_model: h200")), ["NVIDIA H200"])
    check_gpu_model(load_spec(text=CUDA_SPEC.replace("device: cuda\ngpu_model: H200", "device: cpu")), [])
    check_gpu_model(load_spec(text=CUDA_SPEC.replace("gpu_model: H200\n", "")), ["NVIDIA H100 80GB HBM3"])

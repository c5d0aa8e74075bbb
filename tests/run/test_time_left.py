"""longca.run.time_left: a cell starts only where its projection, for the draws it has not kept, fits
in the time its run has left; a run leaves the others for later, with no file and no row."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longca.run.chunk import run_chunk
from longca.run.time_left import MARGIN, TimeLeft, load_estimates
from longca.spec.cells import expand
from longca.spec.load import load_spec

SPEC = """
name: t
device: cpu
repeat: {warmup: 0, iters: 2, min_iters: 1, budget_s: 0.1, l2_flush: false}
check: {max_seqlen: 128}
mask_samples: {multi_document: 3, single: 1}
kernels: [naive, sdpa_math]
masks: [full, causal_document]
seqlens: [64]
heads: ["2:2"]
head_dims: [16]
dtypes: [float32]
passes: [fwd]
sweeps: [{name: s}]
"""


def _cells(tmp_path: Path):
    path = tmp_path / "t.yaml"
    path.write_text(SPEC)
    spec = load_spec(path)
    return spec, expand(spec)


def test_a_draw_is_refused_when_its_share_of_the_projection_exceeds_the_time_left(tmp_path):
    _, cells = _cells(tmp_path)
    doc = next(c for c in cells if c.mask == "causal_document")
    full = next(c for c in cells if c.mask == "full")
    assert doc.samples == 3 and full.samples == 1
    assert MARGIN == 1.25  # the figures below: a draw needs 1.25 times its share of the projection
    rule = TimeLeft(stop_at=1000.0, total_s=500.0, estimates={doc.digest: 240.0, full.digest: 240.0})
    assert rule.refusal(doc, now=900.0) is None  # a draw: 1.25 x 80 s in 100 s
    assert rule.refusal(doc, now=950.0) == "left for a later run: needs 100 s a draw (3 draws), 50 s left"
    assert rule.refusal(full, now=750.0) == "left for a later run: needs 300 s, 250 s left"
    assert rule.refusal(full, now=700.0) is None
    assert rule.refusal(full, now=1100.0) == "left for a later run: needs 300 s, 0 s left"
    other = next(c for c in cells if c.mask == "full" and c.kernel != full.kernel)
    assert rule.refusal(other, now=2000.0) is None  # no projection: it runs
    # a draw longer than the whole run fits no call: it runs, as without estimates
    assert TimeLeft(1000.0, 250.0, {full.digest: 240.0}).refusal(full, now=999.0) is None
    assert TimeLeft.from_json(rule.to_json()) == rule
    # after a draw in this run, what it took counts where it is longer than the projection's share
    assert rule.refusal(doc, now=900.0, last_draw_s=70.0) is None  # 1.25 x 80 s in 100 s
    assert rule.refusal(doc, now=900.0, last_draw_s=90.0) == (
        "left for a later run: needs 112 s a draw (3 draws), as its last draw took 90 s, 100 s left"
    )
    assert rule.refusal(other, now=900.0, last_draw_s=90.0) is not None  # no projection, a draw seen


def test_a_cell_refused_between_draws_keeps_the_draws_it_finished_and_writes_no_row(tmp_path):
    from longca.run.cell import run_cell
    from longca.run.time_left import LeftForLater
    from longca.store.draws import draw_file

    _, cells = _cells(tmp_path)
    doc = next(c for c in cells if c.mask == "causal_document" and c.kernel == "naive")
    out = Path(doc.output(tmp_path / "results"))
    asked = []

    def may_start(k: int) -> str | None:
        asked.append(k)
        return "left for a later run: no time" if k == 1 else None

    with pytest.raises(LeftForLater, match="no time"):
        run_cell(doc, keep_draws=out, may_start=may_start)
    assert asked == [0, 1] and draw_file(out, 0).is_file() and not draw_file(out, 1).is_file()
    assert not out.exists()
    # the next run measures draws 1 and 2 only, asking only for them
    asked.clear()
    rows = run_cell(doc, keep_draws=out, may_start=lambda k: asked.append(k))
    assert asked == [1, 2] and [r["mask_sample"] for r in rows] == [0, 1, 2]
    assert {r["status"] for r in rows} == {"ok"}


def test_a_run_leaves_the_cells_that_do_not_fit_and_measures_the_rest(tmp_path, capfd):
    spec, cells = _cells(tmp_path)
    full = [c for c in cells if c.mask == "full"]
    long_, short = full  # naive and sdpa_math on the full mask
    outputs = [c.output(tmp_path / "results") for c in full]
    rule = TimeLeft.starting_now(120.0, {long_.digest: 80.0, short.digest: 0.5})  # 1.25 x 80 s: 100 s
    rule = TimeLeft(rule.stop_at - 60.0, rule.total_s, rule.estimates)  # 60 s of it already spent
    assert run_chunk(spec, outputs, str(tmp_path / "results"), time_left=rule) == 0  # nothing counted missing
    assert not Path(outputs[0]).exists()  # left for a later run: no file, no row
    assert [r["status"] for r in pq.read_table(outputs[1]).to_pylist()] == ["ok"]
    err = capfd.readouterr().err
    from longca.run.rows import cell_line

    assert cell_line(long_, "left for a later run: needs 100 s, ", (1, 2)) in err
    assert "chunk done: 1 cells in" in err and "1 left for a later run (time left)" in err


def test_estimates_load_from_the_projections_table_and_refuse_anything_else(tmp_path):
    good = tmp_path / "e.parquet"
    pq.write_table(pa.table({"cell_digest": ["a", "b", None], "projected_s": [1.5, None, 2.0]}), good)
    assert load_estimates(good) == {"a": 1.5}
    wrong = tmp_path / "w.parquet"
    pq.write_table(pa.table({"cell_digest": ["a"]}), wrong)
    with pytest.raises(ValueError, match="allowed: a Parquet table with columns cell_digest and projected_s"):
        load_estimates(wrong)
    with pytest.raises(ValueError, match="no such file"):
        load_estimates(tmp_path / "none.parquet")


def test_a_cell_whose_draws_are_all_kept_is_written_whatever_the_time_left(tmp_path):
    # a run stopped after the last draw was kept but before the cell file: nothing is left to
    # measure, so no projection holds the cell back
    from longca.run.cell import run_cell
    from longca.store.draws import all_kept, save_draw

    spec, cells = _cells(tmp_path)
    doc = next(c for c in cells if c.mask == "causal_document" and c.kernel == "naive")
    out = doc.output(tmp_path / "results")
    for row in run_cell(doc):
        save_draw(out, row["mask_sample"], row)
    assert all_kept(doc, out)
    rule = TimeLeft.starting_now(100.0, {doc.digest: 1e4})  # never fits, but fits the run: refused
    rule = TimeLeft(rule.stop_at, 1e5, rule.estimates)
    assert rule.refusal(doc) is not None
    assert run_chunk(spec, [out], str(tmp_path / "results"), time_left=rule) == 0
    assert [r["mask_sample"] for r in pq.read_table(out).to_pylist()] == [0, 1, 2]


def test_the_worker_counts_what_a_cells_last_draw_took(tmp_path, monkeypatch):
    # The projection says 1 s a draw; in this run the first draw took 40 s (a fake clock: each of the
    # worker's readings is 40 s after the last), so the second draw needs 1.25 x 40 s, more than the
    # 45 s left: the cell stops after one draw, kept, and the worker reports it left for later.
    import json
    import os
    import types

    import longca.run.time_left as time_left_module
    import longca.run.worker as worker
    from longca.store.draws import draw_file

    spec, cells = _cells(tmp_path)
    doc = next(c for c in cells if c.mask == "causal_document" and c.kernel == "naive")
    out = doc.output(tmp_path / "results")
    readings = iter(range(0, 10_000, 40))
    monkeypatch.setattr(
        worker, "time", types.SimpleNamespace(time=lambda: float(next(readings)), perf_counter=lambda: 0.0)
    )
    monkeypatch.setattr(time_left_module, "time", types.SimpleNamespace(time=lambda: 1000.0))
    rule = TimeLeft(stop_at=1045.0, total_s=500.0, estimates={doc.digest: 3.0})
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"cells": [doc.to_json()], "outputs": [out], "time_left": rule.to_json()}))
    read_fd, write_fd = os.pipe()
    assert worker.main([str(job), str(write_fd)]) == 0  # its status file closed the write end
    with os.fdopen(read_fd) as pipe:
        assert pipe.read().split("\n") == ["START 0", "DRAW 0 0", "SKIP 0", ""]
    assert draw_file(out, 0).is_file() and not draw_file(out, 1).is_file() and not Path(out).exists()


def test_a_first_draw_is_timed_from_the_end_of_the_cells_check(tmp_path, monkeypatch):
    # A check that autotunes takes minutes where a draw takes seconds (fla at 256K on the H200: a
    # 125 s first draw, its check autotuning fla). Here the check takes 100 s of a fake clock and a draw
    # none: timed from the check's end, the first draw took 0 s, so the second (1.25 x 1 s by the
    # projection) fits in the 10 s left and all three draws run; timed from the cell's start it
    # would need 125 s and be refused.
    import json
    import os
    import types

    import longca.run.cell as cell_module
    import longca.run.time_left as time_left_module
    import longca.run.worker as worker

    spec, cells = _cells(tmp_path)
    doc = next(c for c in cells if c.mask == "causal_document" and c.kernel == "naive")
    out = doc.output(tmp_path / "results")
    now = [1000.0]
    clock = types.SimpleNamespace(time=lambda: now[0], perf_counter=lambda: 0.0)
    monkeypatch.setattr(worker, "time", clock)
    monkeypatch.setattr(time_left_module, "time", clock)
    check = cell_module.check_correctness

    def slow_check(*args, **kwargs):
        now[0] += 100.0
        return check(*args, **kwargs)

    monkeypatch.setattr(cell_module, "check_correctness", slow_check)
    rule = TimeLeft(stop_at=1110.0, total_s=500.0, estimates={doc.digest: 3.0})
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"cells": [doc.to_json()], "outputs": [out], "time_left": rule.to_json()}))
    read_fd, write_fd = os.pipe()
    assert worker.main([str(job), str(write_fd)]) == 0
    with os.fdopen(read_fd) as pipe:
        lines = pipe.read().split("\n")
    assert lines[:4] == ["START 0", "DRAW 0 0", "DRAW 0 1", "DRAW 0 2"] and lines[4].startswith("DONE 0")
    assert [r["mask_sample"] for r in pq.read_table(out).to_pylist()] == [0, 1, 2]

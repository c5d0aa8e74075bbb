"""CP chunks on 2-process gloo groups: a hung or crashed group costs only its running cell, the
cells after it run in a new group, no rank outlives its group, and the group's log reaches our
stderr while it runs (so a chunk stopped from outside still shows what hung)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pyarrow.parquet as pq

from longca.run.chunk import run_chunk
from longca.spec.cells import expand
from longca.spec.load import load_spec

SPEC = """
name: cpfaults
device: cpu
repeat: {warmup: 0, iters: 2, min_iters: 1, budget_s: 0.1, l2_flush: false}
check: {max_seqlen: 128}
masks: [causal]
heads: ["2:2"]
head_dims: [16]
dtypes: [float32]
passes: [fwd]
sweeps:
  - {name: good, kernels: [naive], seqlens: [64, 128], timeout_s: 120, cp: {mechanisms: [ring_p2p], world_sizes: [2]}}
  - {name: bad, kernels: [test_hang, test_segfault], seqlens: [64], timeout_s: BAD_S,
     cp: {mechanisms: [ring_p2p], world_sizes: [2]}}
"""


def _chunk(tmp_path: Path, bad_timeout_s: float) -> tuple[str, dict[str, object], list[str]]:
    """The spec and, in payload order, good 64 / hang / segfault / good 128 cells and their outputs."""
    path = tmp_path / "cpfaults.yaml"
    path.write_text(SPEC.replace("BAD_S", str(bad_timeout_s)))
    by_name = {f"{c.kernel}-{c.seqlen}": c for c in expand(load_spec(path))}
    cells = {k: by_name[k] for k in ("naive-64", "test_hang-64", "test_segfault-64", "naive-128")}
    return str(path), cells, [c.output(tmp_path / "results") for c in cells.values()]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _pids(pid_dir: Path) -> list[int]:
    return [int(f.name.split("-")[1]) for f in pid_dir.iterdir()]


def test_hung_and_crashed_cp_cells_cost_only_themselves(tmp_path, plugin_env, monkeypatch, capfd):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    monkeypatch.setenv("LONGCA_TEST_PID_DIR", str(pid_dir))
    spec, cells, outputs = _chunk(tmp_path, 4)
    t0 = time.monotonic()
    run_chunk(load_spec(spec), outputs, str(tmp_path / "results"))
    wall = time.monotonic() - t0
    rows = {}
    for name, out in zip(cells, outputs):
        table = pq.read_table(out).to_pylist()
        assert len(table) == 1
        rows[name] = (table[0]["status"], table[0]["reason"] or "")
    assert rows["naive-64"][0] == "ok", rows["naive-64"]
    hang = rows["test_hang-64"]
    assert hang[0] == "timeout" and "time limit of 4 s" in hang[1], hang
    assert "in _run_module_as_main" in hang[1], hang  # a rank's stack (its last frame), dumped before the kill
    seg = rows["test_segfault-64"]
    assert seg[0] == "error" and "no result from the CP process group (exit code" in seg[1], seg
    assert "SIGSEGV" in seg[1], seg
    assert rows["naive-128"][0] == "ok", rows["naive-128"]  # in a third group, after the crash
    # One group for all would have waited out 120 + 4 + 4 + 120 s (+ grace) on the hung cell.
    assert wall < 90, wall
    # Both ranks of the hung group and the segfaulting rank leave their pid; its peer only when it
    # reached the kernel before torchrun took the group down (a race: seen once in CI under load).
    ranks = sorted(f.name.split("-")[0] for f in pid_dir.iterdir())
    assert ranks in (["0", "1", "1"], ["0", "0", "1", "1"]), ranks
    assert not [p for p in _pids(pid_dir) if _alive(p)]
    err = capfd.readouterr().err
    for name in ("naive-64", "naive-128"):  # rank 0's lines, streamed from the groups' logs
        assert _ok_line(cells[name]).search(err), err[-3000:]
    assert "faulty_kernels.py" in err  # the hung rank's stack shows where it hangs


def test_stopped_chunk_streams_the_group_log_and_leaves_no_rank(tmp_path, plugin_env, stopped_chunk):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    spec, cells, outputs = _chunk(tmp_path, 120)
    env = dict(os.environ, LONGCA_TEST_PID_DIR=str(pid_dir))
    # ready once both ranks are inside the hanging cell
    code, err = stopped_chunk(
        spec, outputs[:2], tmp_path / "results", lambda: len(list(pid_dir.iterdir())) == 2, env=env, ready_s=60
    )
    assert code == 128 + signal.SIGTERM
    assert _ok_line(cells["naive-64"]).search(err)  # the group's log, though the group never ended
    assert "faulty_kernels.py" in err  # and where its ranks were when stopped
    assert not [p for p in _pids(pid_dir) if _alive(p)]


def test_cp_cells_wider_than_the_host_are_unsupported_rows(tmp_path, monkeypatch):
    # A 4-GPU CP cell where 2 GPUs are visible: a row saying why, no group started, no GPU leased.
    import longca.run.chunk as chunk

    path = tmp_path / "wide.yaml"
    path.write_text(
        SPEC.split("sweeps:")[0].replace("device: cpu", "device: cuda") + "sweeps:\n"
        "  - {name: wide, kernels: [naive], seqlens: [64], cp: {mechanisms: [ring_p2p], world_sizes: [4]}}\n"
    )
    (cell,) = expand(load_spec(path))
    monkeypatch.setattr(chunk, "gpu_count", lambda: 2)
    monkeypatch.setattr(chunk, "run_cp_cells", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    asked: list[int] = []
    real_lease = chunk.lease_gpus
    monkeypatch.setattr(chunk, "lease_gpus", lambda n, **k: (asked.append(n), real_lease(n, **k))[1])
    out = cell.output(tmp_path / "results")
    assert run_chunk(load_spec(path), [out], str(tmp_path / "results")) == 0
    assert asked == [0]
    row = pq.read_table(out).to_pylist()[0]
    assert (row["status"], row["reason"]) == ("unsupported", "needs 4 GPUs (world_size); 2 visible")


def test_a_cp_sweep_follows_the_specs_check_and_mask_samples(tmp_path):
    """The spec's check (reduced length) and mask_samples reach CP cells: through the chunk
    supervisor, a causal_document cell of 256 tokens is checked at 128 and measured on 2 draws."""
    path = tmp_path / "cpcheck.yaml"
    path.write_text(
        "name: cpcheck\ndevice: cpu\n"
        "repeat: {warmup: 1, iters: 2, min_iters: 1, budget_s: 0.1, l2_flush: false}\n"
        "check: {max_seqlen: 128}\nmask_samples: {multi_document: 2}\n"
        "heads: ['2:2']\nhead_dims: [16]\ndtypes: [float32]\npasses: [fwd, bwd]\n"
        "sweeps:\n  - {name: cp, kernels: [naive], masks: [causal_document], seqlens: [256],\n"
        "     cp: {mechanisms: [ring_p2p], world_sizes: [2]}}\n"
    )
    spec = load_spec(path)
    cells = expand(spec)
    outputs = [c.output(tmp_path / "results") for c in cells]
    assert run_chunk(spec, outputs, str(tmp_path / "results")) == 0
    for cell, out in zip(cells, outputs):
        rows = pq.read_table(out).to_pylist()
        assert [r["status"] for r in rows] == ["ok", "ok"], [r["reason"] for r in rows]
        assert [r["mask_sample"] for r in rows] == [0, 1] and {r["check_seqlen"] for r in rows} == {128}
        assert {r["cell_digest"] for r in rows} == {cell.digest} and rows[0]["world_size"] == 2


def _ok_line(cell):
    """The terminal's line of a CP cell that ended ok: its place in the chunk, what it is, `ok`."""
    import re

    from longca.run.rows import cell_line

    what = cell_line(cell, "X")[len("[longca] ") : -len(": X")]
    return re.compile(rf"^\[longca\] \d+/\d+ {re.escape(what)}: ok \d", re.M)

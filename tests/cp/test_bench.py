"""The bench's cell runner on a gloo group of 2 CPU processes: rows that fit the schema, exact
FLOPs, areas and bytes, and every failure path ending as a row with the same status on all ranks."""

from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from longca.cp import bench
from longca.cp.local import LOCAL_KERNELS, Naive
from longca.masks.registry import build_mask
from longca.store.schema import to_table

BASE = {"mechanism": "ring_p2p", "mask": "causal", "mask_params": {}, "seqlen": 64, "batch": 2, "heads_q": 4,
        "heads_kv": 2, "head_dim": 8, "dtype": "float64", "pass": "fwd_bwd", "world_size": 2, "degrees": {},
        "balance": "zigzag", "local_kernel": "naive", "seed": 0, "warmup": 1, "iters": 2, "budget_s": 30,
        "device": "cpu", "backend": "gloo"}
CELLS = [
    dict(BASE, cell_id="ok_ring"),
    dict(BASE, cell_id="ok_ring_bwd", **{"pass": "bwd"}),
    dict(BASE, cell_id="ok_usp_fwd", mechanism="usp", degrees={"ulysses": 2, "ring": 1}, mask="causal_document",
         balance="document", **{"pass": "fwd"}),
    dict(BASE, cell_id="heads", mechanism="ulysses", heads_q=3, heads_kv=1),
    dict(BASE, cell_id="bad_mask", mask="diagonal"),
    dict(BASE, cell_id="indivisible", seqlen=66),
    dict(BASE, cell_id="wrong_kernel", local_kernel="off_by_one_percent"),
    dict(BASE, cell_id="warm_count", warmup=3, **{"pass": "fwd"}),
    dict(BASE, cell_id="warm_budget", warmup=3, warmup_s=1e-9, **{"pass": "fwd"}),  # ranks stop together
    dict(BASE, cell_id="cooled", cooldown_s=0.2, **{"pass": "fwd"}),  # every rank idles before its warm-up
]


class _OffByOnePercent(Naive):
    """A deliberately wrong local kernel: the correctness gate must turn it into `incorrect`."""

    name = "off_by_one_percent"

    def fwd(self, q, k, v, sub):
        out, lse = super().fwd(q, k, v, sub)
        return out * 1.01, lse


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    LOCAL_KERNELS["off_by_one_percent"] = _OffByOnePercent
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for cell in CELLS:
        row = bench.run_cell(cell, rank, 2, torch.device("cpu"))
        if rank == 0:
            bench.write_row(row, out_dir)
        else:  # every rank must reach the same verdict
            with open(os.path.join(out_dir, f"{cell['cell_id']}.rank1"), "w") as f:
                f.write(row["status"])
    dist.destroy_process_group()


def test_cells_become_rows(tmp_path):
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    rows = {c["cell_id"]: json.load(open(tmp_path / f"{c['cell_id']}.json")) for c in CELLS}
    to_table(list(rows.values()))  # every key is a schema column, every status allowed
    for cid, row in rows.items():
        assert (tmp_path / f"{cid}.rank1").read_text() == row["status"]

    ok = rows["ok_ring"]
    assert ok["status"] == "ok", ok["reason"]
    bwd = rows["ok_ring_bwd"]  # backward samples all run on one forward's graph, and the row says so
    assert bwd["status"] == "ok" and (ok["timer"], bwd["timer"]) == ("cpu_monotonic", "cpu_monotonic+retained_graph")
    area = build_mask("causal", 64).area
    assert ok["mask_area"] == 2 * area and sum(ok["rank_area"]) == 2 * area
    assert ok["rank_area"] == [2 * area // 2] * 2  # zigzag balances causal exactly
    assert ok["flops"] == 3.5 * 4 * 2 * area * 4 * 8
    # fwd: one KV exchange; bwd: one KV exchange and two dK/dV hops (float64): 4 x (K + V bytes).
    kv_bytes = 2 * (2 * 2 * 32 * 8 * 8)
    assert ok["rank_bytes_sent"] == [4 * kv_bytes] * 2
    assert max(ok[k] for k in ("rel_err_out", "rel_err_dq", "rel_err_dk", "rel_err_dv")) < 1e-12
    assert ok["timed_iters"] == len(ok["samples_ms"]) >= 1
    assert ok["tflops"] == ok["flops"] / (ok["median_ms"] * 1e-3 * 2) / 1e12
    assert json.loads(ok["cp_degrees"]) == {"ulysses": 1, "ring": 2, "windows": 1}

    usp = rows["ok_usp_fwd"]
    assert usp["status"] == "ok", usp["reason"]
    assert usp["rel_err_out"] < 1e-12 and usp.get("rel_err_dq") is None  # forward cells check the output

    assert rows["heads"]["status"] == "unsupported"
    assert "heads_q=3 is not divisible by the Ulysses degree 2" in rows["heads"]["reason"]
    assert rows["bad_mask"]["status"] == "error" and "'mask' = 'diagonal'; allowed" in rows["bad_mask"]["reason"]
    assert rows["indivisible"]["status"] == "unsupported" and "seqlen=66" in rows["indivisible"]["reason"]
    wrong = rows["wrong_kernel"]
    assert wrong["status"] == "incorrect" and "rel_err_out" in wrong["reason"] and wrong.get("median_ms") is None

    # phase times, and the warm-up count a time budget cuts
    assert ok["check_s"] > 0 and 0 < ok["warmup_s"] <= ok["timer_wall_s"] <= ok["cell_wall_s"]
    assert ok["warmup_iters"] == 1
    assert rows["warm_count"]["warmup_iters"] == 3
    assert rows["warm_budget"]["status"] == "ok" and rows["warm_budget"]["warmup_iters"] == 1
    cooled = rows["cooled"]
    assert cooled["status"] == "ok" and cooled["cooldown_s"] >= 0.2 and ok["cooldown_s"] == 0.0
    # the pause lies outside the timer and inside the cell
    assert cooled["timer_wall_s"] + cooled["cooldown_s"] <= cooled["cell_wall_s"]
    assert ok.get("clock_start_mhz") is None  # CPU ranks have no GPU clock to read

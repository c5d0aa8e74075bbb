"""The CP cell runner on a gloo group of 2 CPU processes: rows from the one row builder that fit
the schema, exact FLOPs, areas and bytes, the spec's check and mask draws applied, and every
failure path ending as a row with the same status on all ranks."""

from __future__ import annotations

import os

import pyarrow.parquet as pq
import pytest
import rank_hits
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from longca.kernels.adapters.naive import RankNaive as Naive
from longca.kernels.base import RankCapabilities
from longca.kernels.registry import KERNELS, get
from longca.masks.registry import build_mask
from longca.measure.stats import MedianCI
from longca.run import ranks
from longca.run.chunk import free_port
from longca.run.ranks import CP_GRAPH_REASON
from longca.store.write import write_rows

from .cp_cells import cp_cell

CELLS = {
    "ok_ring": cp_cell(),
    "ok_ring_bwd": cp_cell(pass_="bwd"),
    "ok_usp_fwd": cp_cell(
        cp_mechanism="usp",
        cp_degrees=(("ulysses", 2), ("ring", 1)),
        mask="causal_document",
        cp_balance="document",
        pass_="fwd",
    ),
    "heads": cp_cell(cp_mechanism="ulysses", cp_degrees=(("ulysses", 2),), heads_q=3, heads_kv=1),
    "indivisible": cp_cell(seqlen=66),
    "wrong_kernel": cp_cell(kernel="off_by_one_percent"),
    "not_per_rank": cp_cell(kernel="sdpa_math"),
    "warm_count": cp_cell(pass_="fwd", repeat={"warmup": 3}),
    "warm_budget": cp_cell(pass_="fwd", repeat={"warmup": 3, "warmup_s": 1e-9}),  # ranks stop together
    # every rank idles before its warm-up; graph replay asked for, and the row says why there is none
    "cooled": cp_cell(pass_="fwd", repeat={"cooldown_s": 0.2, "graph": True}),
    # the adaptive protocol: ranks decide together when the interval is narrow enough. Calls of about
    # 100 ms: at the default 64 tokens (about 1 ms) two gloo ranks on two cores timed 1 ms and 5-7 ms
    # calls in about equal shares, and 1 run in 6 ended at 200 calls with the median's interval
    # spanning both, wider than +-50%
    "adaptive": cp_cell(
        pass_="fwd", seqlen=1024, head_dim=32, repeat={"iters": 200, "budget_s": 5.0, "ci_target": 0.5}
    ),
    # the spec's check applies: its reduced length, and one row per mask draw
    "short_check": cp_cell(seqlen=256, pass_="fwd", check={"max_seqlen": 128}),
    "draws": cp_cell(seqlen=256, pass_="fwd", mask="causal_document", cp_balance="document", samples=3),
    # full-length agreement: the gathered CP output against one device's on the whole sequence
    "agree": cp_cell(seqlen=256, pass_="bwd", check={"max_seqlen": 128, "agree_with": ["naive"]}),
    "agree_wrong_long": cp_cell(
        kernel="wrong_beyond_check", seqlen=256, pass_="fwd", check={"max_seqlen": 128, "agree_with": ["naive"]}
    ),
    "agree_wrong_grad_long": cp_cell(
        kernel="wrong_grad_beyond_check", seqlen=256, pass_="bwd", check={"max_seqlen": 128, "agree_with": ["naive"]}
    ),
}


class _OffByOnePercent(Naive):
    """A deliberately wrong per-rank kernel: the correctness gate must turn it into `incorrect`."""

    def fwd(self, q, k, v, sub):
        out, lse = super().fwd(q, k, v, sub)
        return out * 1.01, lse


class _WrongBeyondCheck(Naive):
    """Right on the shards of the 128-token check, 5% off on longer ones: only agreement sees it."""

    def fwd(self, q, k, v, sub):
        out, lse = super().fwd(q, k, v, sub)
        return (out * 1.05 if q.shape[2] > 64 else out), lse


class _WrongGradBeyondCheck(Naive):
    """Its output right everywhere, its dK 5% off on shards longer than the check's: only a full-length
    agreement of the gradients sees it."""

    def bwd(self, dout, q, k, v, out, lse, sub):
        dq, dk, dv = super().bwd(dout, q, k, v, out, lse, sub)
        return dq, (dk * 1.05 if q.shape[2] > 64 else dk), dv


class _WrongBeyondCheckKernel:
    name = "wrong_beyond_check"
    layout = "bhsd"
    description = "test: a per-rank kernel wrong beyond the check length"
    caps = get("naive").caps
    rank = _WrongBeyondCheck

    def rank_kernel(self):
        return self.rank()

    def prepare(self, mask, **kw):  # on one device it is naive: the comparator's side is right
        return get("naive").prepare(mask, **kw)


class _WrongGradBeyondCheckKernel(_WrongBeyondCheckKernel):
    name = "wrong_grad_beyond_check"
    description = "test: a per-rank kernel whose gradients are wrong beyond the check length"
    rank = _WrongGradBeyondCheck


class _OffByOnePercentKernel:
    name = "off_by_one_percent"
    layout = "bhsd"
    description = "test: a per-rank kernel 1% off"
    caps = get("naive").caps

    def rank_kernel(self):
        return _OffByOnePercent()


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    KERNELS.setdefault("off_by_one_percent", _OffByOnePercentKernel())
    KERNELS.setdefault("wrong_beyond_check", _WrongBeyondCheckKernel())
    KERNELS.setdefault("wrong_grad_beyond_check", _WrongGradBeyondCheckKernel())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    for name, cell in CELLS.items():
        rows = ranks.run_cell(cell, rank, 2, torch.device("cpu"))
        if rank == 0:
            write_rows(os.path.join(out_dir, f"{name}.parquet"), rows)  # every key a schema column
        else:  # every rank must reach the same verdict
            with open(os.path.join(out_dir, f"{name}.rank1"), "w") as f:
                f.write(",".join(r["status"] for r in rows))
    rank_hits.save(out_dir)  # for the mutation score (tests/support/rank_hits.py)
    dist.destroy_process_group()


def test_cells_become_rows(tmp_path):
    assert isinstance(get("naive").caps.cp, RankCapabilities)
    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    rank_hits.merge(tmp_path)
    tables = {name: pq.read_table(tmp_path / f"{name}.parquet").to_pylist() for name in CELLS}
    for name, rows in tables.items():
        assert (tmp_path / f"{name}.rank1").read_text() == ",".join(r["status"] for r in rows)
    rows = {name: t[0] for name, t in tables.items()}

    ok = rows["ok_ring"]
    assert ok["status"] == "ok", ok["reason"]
    assert (ok["cell_id"], ok["cell_digest"], ok["world_size"]) == (CELLS["ok_ring"].id, CELLS["ok_ring"].digest, 2)
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
    assert ok["check_seqlen"] == 64
    assert ok["timed_iters"] == len(ok["samples_ms"]) >= 1
    assert ok["tflops"] == ok["flops"] / (ok["median_ms"] * 1e-3 * 2) / 1e12
    assert ok["cp_degrees"] == '{"ring": 2, "ulysses": 1, "windows": 1}' and ok["layout"] == "bhsd"
    assert ok["backend"] == "naive" and ok["mask_form"] == "slices" and ok["device_count"] == 2

    adaptive = rows["adaptive"]
    assert adaptive["status"] == "ok" and adaptive["ci_target"] == 0.5
    assert adaptive["timed_iters"] >= 6 and adaptive["ci_low_ms"] <= adaptive["median_ms"] <= adaptive["ci_high_ms"]
    # Two gloo ranks sharing two cores time alike calls differently from run to run, so whether
    # +-50% is reached varies (1 run in 6 missed it at 64 tokens): the row says truly whether it
    # was, and a rank stops short of the cap and the budget only once it is.
    ci = MedianCI(adaptive["ci_low_ms"], adaptive["ci_high_ms"], covered=True)  # >= 6 samples reach 95%
    assert adaptive["ci_met"] is (ci.half_width(adaptive["median_ms"]) <= 0.5)
    assert adaptive["ci_met"] or adaptive["timed_iters"] == 200 or adaptive["timer_wall_s"] >= 5.0
    assert ok["ci_target"] is None and ok["ci_low_ms"] <= ok["median_ms"] <= ok["ci_high_ms"]

    usp = rows["ok_usp_fwd"]
    assert usp["status"] == "ok", usp["reason"]
    assert usp["rel_err_out"] < 1e-12 and usp.get("rel_err_dq") is None  # forward cells check the output

    assert rows["heads"]["status"] == "unsupported"
    assert "heads_q=3 is not divisible by the Ulysses degree 2" in rows["heads"]["reason"]
    assert rows["indivisible"]["status"] == "unsupported" and "seqlen=66" in rows["indivisible"]["reason"]
    wrong = rows["wrong_kernel"]
    assert wrong["status"] == "incorrect" and "out=" in wrong["reason"] and wrong.get("median_ms") is None
    assert wrong["rel_err_out"] > 1e-3  # the errors the verdict saw are in the row
    assert rows["not_per_rank"]["status"] == "unsupported"
    assert "cannot be a context-parallel per-rank kernel" in rows["not_per_rank"]["reason"]

    # phase times, and the warm-up count a time budget cuts
    assert ok["check_s"] > 0 and 0 < ok["warmup_s"] <= ok["timer_wall_s"] <= ok["cell_wall_s"]
    assert ok["warmup_iters"] == 1
    assert rows["warm_count"]["warmup_iters"] == 3
    assert rows["warm_budget"]["status"] == "ok" and rows["warm_budget"]["warmup_iters"] == 1
    cooled = rows["cooled"]
    assert cooled["status"] == "ok" and cooled["cooldown_s"] >= 0.2 and ok["cooldown_s"] == 0.0
    assert cooled["graph_reason"] == CP_GRAPH_REASON and ok.get("graph_reason") is None
    assert cooled["timer_wall_s"] + cooled["cooldown_s"] <= cooled["cell_wall_s"]  # the pause is outside the timer
    assert ok.get("clock_start_mhz") is None  # CPU ranks have no GPU clock to read

    short = rows["short_check"]
    assert short["status"] == "ok" and short["check_seqlen"] == 128  # the spec's check.max_seqlen
    draws = tables["draws"]
    assert [r["status"] for r in draws] == ["ok"] * 3 and [r["mask_sample"] for r in draws] == [0, 1, 2]
    areas = [2 * build_mask("causal_document", 256, {}, seed=0, sample=i).area for i in range(3)]
    assert [r["mask_area"] for r in draws] == areas and len(set(areas)) == 2  # each row measured its own draw
    assert all(r["mask_samples"] == 3 for r in draws)

    # full-length agreement: the CP output gathered and compared with one device's
    agree = rows["agree"]
    assert agree["status"] == "ok" and agree["check_seqlen"] == 128
    assert agree["agree_kernel"] == "naive" and agree["agree_rel_diff"] < 1e-6  # naive softmaxes in float32
    assert short.get("agree_kernel") is None and short.get("agree_reason") is None  # not asked for
    wrong_long = rows["agree_wrong_long"]
    assert wrong_long["status"] == "incorrect" and wrong_long["rel_err_out"] < 1e-12  # the check passed
    assert "disagrees with naive at the full length S=256" in wrong_long["reason"]
    assert wrong_long["agree_rel_diff"] == pytest.approx(0.05, rel=1e-6)  # the row keeps what disagreed
    assert wrong_long.get("median_ms") is None
    # a backward cell's agreement covers the gathered gradients
    assert all(agree[f"agree_rel_diff_{g}"] < 1e-6 for g in ("dq", "dk", "dv"))
    wrong_grad = rows["agree_wrong_grad_long"]
    assert wrong_grad["status"] == "incorrect" and wrong_grad["rel_err_dk"] < 1e-12  # the check passed
    assert wrong_grad["agree_rel_diff"] < 1e-6 and wrong_grad["agree_rel_diff_dq"] < 1e-6
    assert "disagrees with naive at the full length S=256" in wrong_grad["reason"] and "dk=" in wrong_grad["reason"]
    assert wrong_grad.get("median_ms") is None

"""LocalComm: one process plays one rank of a plain ring, forward only, on the right data."""

from __future__ import annotations

import pytest
import torch

from longca.cp.comm import LocalComm
from longca.cp.mechanisms import build_plan, cp_attention
from longca.cp.reference import reference_attention
from longca.cp.sharding import make_sharding
from longca.cp.topology import Topology
from longca.kernels.registry import rank_kernel
from longca.masks.registry import build_mask
from longca.measure.reference import relative_error

CPU = torch.device("cpu")


def _shards(world: int, mask_name: str, balance: str, s: int = 64, hq: int = 4, hk: int = 2, d: int = 8):
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, h, s, d, generator=g, dtype=torch.float64) for h in (hq, hk, hk))
    mask = build_mask(mask_name, s, {"window": 8} if "window" in mask_name else None)
    sharding = make_sharding(balance, s, world, mask.slices)
    pos = [torch.from_numpy(sharding.positions(r)) for r in range(world)]
    kv_of = [(k[:, :, p].contiguous(), v[:, :, p].contiguous()) for p in pos]
    return q, k, v, mask, sharding, pos, kv_of


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("mechanism", ["ring_p2p", "ring_allgather"])
@pytest.mark.parametrize(
    "mask_name, balance",
    [
        ("causal", "zigzag"),
        ("full_document", "document"),
        ("causal_sliding_window", "contiguous"),
        ("share_question", "zigzag"),
    ],
)
def test_every_rank_played_alone_matches_the_reference_rows(world, mechanism, mask_name, balance):
    q, k, v, mask, sharding, pos, kv_of = _shards(world, mask_name, balance)
    ref = reference_attention(q, k, v, mask.slices)[0]
    for r in range(world):
        comm = LocalComm(kv_of, r)
        plan = build_plan(
            mechanism,
            None,
            mask.slices,
            sharding,
            r,
            4,
            2,
            rank_kernel("naive"),
            CPU,
            comm,
            topo=Topology(world, r, 1, world),
        )
        with torch.no_grad():
            out = cp_attention(q[:, :, pos[r]].contiguous(), kv_of[r][0], kv_of[r][1], plan)
        assert relative_error(out, ref[:, :, pos[r]]) < 1e-12, (mechanism, mask_name, r)
        assert comm.bytes_sent == 0


def test_local_comm_refuses_what_it_cannot_play():
    *_, kv_of = _shards(2, "causal", "zigzag")
    comm = LocalComm(kv_of, 0)
    with pytest.raises(ValueError, match="forward's K/V exchanges only"):
        comm.exchange([torch.zeros(1), torch.zeros(1)], 1, 1, None)
    with pytest.raises(ValueError, match="no Ulysses"):
        comm.all_to_all([torch.zeros(1), torch.zeros(1)], 0, None)


def _rank_local_benchmark():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "cp_rank_local.py"
    spec = importlib.util.spec_from_file_location("cp_rank_local", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


_TINY = (
    "--device cpu --kernel naive --single naive --masks causal --tokens-per-gpu 32 --heads 4:2 --head-dim 8"
    " --dtype float32 --check-seqlen 64 --world 4 --iters 5"
).split()


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_rank_local_benchmark_runs_end_to_end_on_the_cpu(tmp_path, pass_):
    """benchmarks/cp_rank_local.py (the one-GPU diagnostic of a rank's CP forward or backward) on
    tiny CPU sizes: every rank checked, timed, and its area counted; CPU times mean nothing."""
    import json

    out = tmp_path / "rows.json"
    assert _rank_local_benchmark().main([str(out), *_TINY, "--pass", pass_]) == 0
    (row,) = json.loads(out.read_text())
    assert row["status"] == "ok" and row["rel_err_out"] < 1e-5 and len(row["ranks"]) == 4
    if pass_ == "bwd":
        assert max(row[f"rel_err_d{x}"] for x in "qkv") < 1e-5
    assert sum(r["area"] for r in row["ranks"]) == build_mask("causal", 128).area  # zigzag: every pair once
    assert len({r["area"] for r in row["ranks"]}) == 1  # and balanced
    assert row["cp_per_gpu_tflops"] > 0 and row["single_tflops"] > 0
    if pass_ == "fwd":
        assert row["native_gqa"] is None  # recorded for sdpa's local kernels, which choose; naive has no choice


def test_rank_local_benchmark_refuses_autograd_timing_without_a_differentiable_step(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _rank_local_benchmark().main([str(tmp_path / "rows.json"), *_TINY, "--pass", "bwd", "--also-autograd"])
    assert (
        "--also-autograd needs --pass bwd and --kernel flex, not --pass bwd --kernel naive" in capsys.readouterr().err
    )
    assert not (tmp_path / "rows.json").exists()

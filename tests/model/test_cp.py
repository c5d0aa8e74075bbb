"""The CP model: pinned schedules, the overlap each mechanism's code allows, rates, and the
`longca model cp` command on a small spec with constructed rates."""

from __future__ import annotations

import math

import polars as pl
import pytest
import torch

from longca.cli import main
from longca.cp.mechanisms import resolve_degrees, step_cuts
from longca.cp.sharding import make_sharding
from longca.cp.topology import Topology
from longca.cp.trace import Collective, Compute, Post, Wait, trace_rank
from longca.kernels.base import Unsupported
from longca.masks.registry import build_mask
from longca.model.cluster import load_cluster
from longca.model.cp import simulate
from longca.model.rates import load_rates

WORLD, S = 4, 1024
CLUSTER = """
name: t
gpu: TestGPU
gpus_per_node: {per_node}
nodes: {nodes}
links:
  intra_node: {{bandwidth_gbs: {bw}, latency_us: 0, source: test}}
  inter_node: {{bandwidth_gbs: {bw}, latency_us: 0, source: test}}
"""


def _traces(mech: str, degrees=None, pass_: str = "fwd", mask: str = "causal", balance: str = "zigzag"):
    m = build_mask(mask, S, {}, seed=0)
    sharding = make_sharding(balance, S, WORLD, m.slices)
    u, r, w = resolve_degrees(mech, WORLD, degrees)
    topo, cuts = Topology(WORLD, 0, u, r, w), step_cuts(m.slices, sharding, u, r)
    return [
        trace_rank(
            mech,
            degrees,
            m.slices,
            sharding,
            rank,
            batch=1,
            heads_q=4,
            heads_kv=4,
            head_dim=16,
            dtype=torch.bfloat16,
            pass_=pass_,
            topo=topo,
            cuts=cuts,
        )
        for rank in range(WORLD)
    ]


def _pattern(events) -> str:
    letter = {Compute: "C", Post: "P", Wait: "W"}
    return " ".join(letter.get(type(e)) or e.kind for e in events)


# The schedules as the mechanisms' code runs them (rank 0, 4 ranks): a change to a schedule
# changes the model's overlap, so it must show up here and be looked at.
SCHEDULES = {
    ("ring_p2p", "fwd"): "P C W P C W P C W C",
    ("ring_p2p", "bwd"): "P C P W P C W P W P C W P W C W P W",
    ("ring_allgather", "fwd"): "all_gather all_gather C C C C",
    ("ring_allgather", "bwd"): "all_gather all_gather C C C C reduce_scatter reduce_scatter",
    ("ulysses", "fwd"): "all_to_all all_to_all all_to_all C all_to_all",
    ("ulysses", "bwd"): "all_to_all C all_to_all all_to_all all_to_all",
}


@pytest.mark.parametrize(("mech", "pass_"), sorted(SCHEDULES))
def test_schedules_are_pinned(mech, pass_):
    assert _pattern(_traces(mech, pass_=pass_)[0]) == SCHEDULES[(mech, pass_)]


def _cluster(seconds_per_kv: float, per_node: int = 8, nodes: int = 1):
    """A cluster on which one rank's K+V exchange (bf16, 4 heads x 256 tokens x 16 x 2) takes
    `seconds_per_kv`."""
    kv_bytes = 2 * 4 * (S // WORLD) * 16 * 2
    return load_cluster(text=CLUSTER.format(per_node=per_node, nodes=nodes, bw=kv_bytes / seconds_per_kv / 1e9))


def test_ring_steps_overlap_their_transfer_with_compute():
    traces = _traces("ring_p2p", mask="full", balance="contiguous")
    one = lambda e: 1.0  # noqa: E731 - every attention call one second
    # 3 exchanged steps and the last: each step takes the longer of compute and transfer
    assert simulate(traces, _cluster(0.5), one).seconds == pytest.approx(4.0)
    assert simulate(traces, _cluster(2.0), one).seconds == pytest.approx(3 * 2.0 + 1.0)
    assert simulate(traces, _cluster(2.0), one, comm=False).seconds == pytest.approx(4.0)


def test_allgather_blocks_before_compute():
    traces = _traces("ring_allgather", mask="full", balance="contiguous")
    # K and V all-gathered, each in 3 ring messages of one rank's K (half the exchange), then 4 calls
    t = simulate(traces, _cluster(2.0), lambda e: 1.0).seconds
    assert t == pytest.approx(2 * 3 * 1.0 + 4.0)


def test_an_exchange_waits_for_the_slower_peer():
    traces = _traces("ring_p2p", mask="causal", balance="contiguous")
    # contiguous causal: rank 3 has 4 calls, rank 0 one; everyone finishes with the busiest rank
    busiest = max(sum(isinstance(e, Compute) and e.area > 0 for e in t) for t in traces)
    tl = simulate(traces, _cluster(1e-6), lambda e: 1.0 if e.area else 0.0)
    assert busiest == 4 and tl.seconds == pytest.approx(4.0, rel=1e-3)
    assert tl.rank_compute[0] < tl.rank_compute[3]


def test_inter_node_links_slow_what_crosses_nodes():
    traces = _traces("ring_p2p", mask="full", balance="contiguous")
    c = _cluster(2.0, per_node=2, nodes=2)
    fast = load_cluster(text=CLUSTER.format(per_node=4, nodes=1, bw=c.intra.bandwidth_gbs))
    assert simulate(traces, c, lambda e: 1.0).seconds == simulate(traces, fast, lambda e: 1.0).seconds
    slow = c.__class__(c.name, c.gpu, 2, 2, c.intra, c.inter.__class__(c.inter.bandwidth_gbs / 4, 0, "t"))
    assert simulate(traces, slow, lambda e: 1.0).seconds == pytest.approx(3 * 8.0 + 1.0)


def _rates_file(tmp_path, gpu: str = "TestGPU"):
    rows = [
        dict(
            kernel="naive",
            mask=m,
            **{"pass": p},
            heads_q=4,
            heads_kv=2,
            head_dim=16,
            dtype="float32",
            seqlen_q=s,
            status="ok",
            world_size=1,
            device_name=gpu,
            tflops=t,
        )
        for m in ("full", "causal", "causal_document")
        for p in ("fwd", "bwd")
        for s, t in ((128, 100.0), (512, 200.0))
    ]
    path = tmp_path / "rates.parquet"
    pl.DataFrame(rows).write_parquet(path)
    return path


def test_rates_interpolate_in_log_length_and_hold_at_the_ends(tmp_path):
    r = load_rates([_rates_file(tmp_path)], "TestGPU")
    args = ("naive", "full", "fwd", 4, 2, 16, "float32")
    assert r.tflops(*args, 256) == pytest.approx(150.0)
    assert r.tflops(*args, 64) == 100.0 and r.tflops(*args, 4096) == 200.0
    with pytest.raises(Unsupported, match="no measured single-GPU rate"):
        r.tflops("naive", "sliding_window", "fwd", 4, 2, 16, "float32", 256)
    with pytest.raises(ValueError, match="no ok single-GPU rows"):
        load_rates([_rates_file(tmp_path)], "B200")


SPEC = """
name: tiny-cp
device: cpu
kernels: [naive]
masks: [full, causal]
seqlens: [512]
heads: ["4:2"]
head_dims: [16]
dtypes: [float32]
passes: [fwd, bwd]
sweeps:
  - name: cp
    cp: {mechanisms: [ring_p2p, ulysses, ring_allgather], world_sizes: [2, 4], backend: gloo}
"""


def test_model_cp_writes_a_model_table(tmp_path, capsys):
    spec, cluster = tmp_path / "tiny-cp.yaml", tmp_path / "c.yaml"
    spec.write_text(SPEC)
    cluster.write_text(CLUSTER.format(per_node=2, nodes=1, bw=10.0))
    out = tmp_path / "model.parquet"
    code = main(
        [
            "model",
            "cp",
            "--spec",
            str(spec),
            "--cluster",
            str(cluster),
            "--rates",
            str(_rates_file(tmp_path)),
            "--out",
            str(out),
        ]
    )
    assert code == 0
    t = pl.read_parquet(out)
    assert set(t.get_column("source")) == {"model"} and t.height == 2 * 2 * 3 * 2
    ok, too_big = t.filter(pl.col("world_size") == 2), t.filter(pl.col("world_size") == 4)
    assert set(ok.get_column("status")) == {"ok"}
    assert set(too_big.get_column("reason")) == {"world size 4 exceeds the cluster's 2 GPUs (t)"}
    # per-GPU rate never above the kernel's measured rate at the same work
    assert ok.get_column("tflops").max() <= 200.0 and ok.get_column("tflops").min() > 0
    assert all(math.isclose(a + b, c) for a, b, c in ok.select("compute_ms", "comm_exposed_ms", "median_ms").rows())
    assert "modelled 24 cells (12 ok)" in capsys.readouterr().out


def test_a_document_mask_is_modelled_over_its_draws(tmp_path):
    spec, cluster = tmp_path / "tiny-cp.yaml", tmp_path / "c.yaml"
    spec.write_text(SPEC.replace("masks: [full, causal]", "masks: [causal, causal_document]").replace("[2, 4]", "[2]"))
    cluster.write_text(CLUSTER.format(per_node=2, nodes=1, bw=10.0))
    out = tmp_path / "model.parquet"
    args = ["model", "cp", "--spec", str(spec), "--cluster", str(cluster), "--rates", str(_rates_file(tmp_path))]
    assert main([*args, "--out", str(out), "--draws", "3"]) == 0
    t = pl.read_parquet(out).filter(pl.col("status") == "ok")
    docs, causal = t.filter(pl.col("mask") == "causal_document"), t.filter(pl.col("mask") == "causal")
    assert set(docs.get_column("draws")) == {3} and set(causal.get_column("draws")) == {1}  # causal has no draws
    for row in docs.iter_rows(named=True):
        assert sorted(row["tflops_draws"])[1] == pytest.approx(row["tflops"])  # the median draw's row


def test_model_cp_refuses_a_bad_cluster_before_modelling(tmp_path, capsys):
    spec, cluster = tmp_path / "tiny-cp.yaml", tmp_path / "c.yaml"
    spec.write_text(SPEC)
    cluster.write_text(CLUSTER.format(per_node=2, nodes=0, bw=10.0))
    code = main(["model", "cp", "--spec", str(spec), "--cluster", str(cluster), "--rates", "x.parquet", "--out", "o"])
    assert code == 2 and "field 'nodes'" in capsys.readouterr().err


def test_trace_events_are_typed():
    events = _traces("usp", {"ulysses": 2, "ring": 2})[0]
    assert {type(e) for e in events} == {Compute, Post, Wait, Collective}

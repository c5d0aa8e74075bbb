"""A rank's traced schedule (longca.cp.trace) is what the mechanism does on real process groups:
the same collectives and exchanges, in the same order, with the same bytes and peers, for every
mechanism, on 4 gloo CPU processes, forward and backward."""

from __future__ import annotations

import datetime
import json
import os

import rank_hits
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from longca.cp.comm import Comm
from longca.cp.mechanisms import build_plan, cp_attention, resolve_degrees, step_cuts
from longca.cp.sharding import make_sharding
from longca.cp.topology import Topology
from longca.cp.trace import Collective, Post, trace_rank
from longca.kernels.registry import rank_kernel
from longca.masks.registry import build_mask
from longca.run.chunk import free_port

WORLD, SEQLEN, BATCH, HQ, HKV, D = 4, 64, 1, 4, 2, 8
CASES = [
    ("ulysses", None),
    ("ring_p2p", None),
    ("ring_allgather", None),
    ("usp", {"ulysses": 2, "ring": 2}),
    ("loongtrain", {"ulysses": 1, "ring": 4, "windows": 2}),
]


class Recording(Comm):
    """The real collectives (gloo), each recorded as (kind, bytes this rank sends, peers)."""

    def __init__(self, log: list) -> None:
        super().__init__(enabled=True)
        self.log = log

    def _sent(self, kind: str, before: int, peers) -> None:
        self.log.append([kind, self.bytes_sent - before, peers])

    def exchange(self, tensors, send_to, recv_from, group):
        b = self.bytes_sent
        out = super().exchange(tensors, send_to, recv_from, group)
        self._sent("exchange", b, [send_to, recv_from])
        return out

    def all_to_all(self, chunks, me, group):
        b = self.bytes_sent
        out = super().all_to_all(chunks, me, group)
        if len(chunks) > 1:
            self._sent("all_to_all", b, None)
        return out

    def all_gather(self, t, n, group):
        b = self.bytes_sent
        out = super().all_gather(t, n, group)
        if n > 1:
            self._sent("all_gather", b, None)
        return out

    def reduce_scatter(self, stacked, me, group):
        b = self.bytes_sent
        out = super().reduce_scatter(stacked, me, group)
        if stacked.shape[0] > 1:
            self._sent("reduce_scatter", b, None)
        return out


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=120),
    )
    mask = build_mask("causal", SEQLEN, {}, seed=0)
    sharding = make_sharding("zigzag", SEQLEN, WORLD, mask.slices)
    pos = torch.from_numpy(sharding.positions(rank))
    g = torch.Generator().manual_seed(5)
    q, dout = (torch.randn(BATCH, HQ, SEQLEN, D, generator=g, dtype=torch.float32) for _ in range(2))
    k, v = (torch.randn(BATCH, HKV, SEQLEN, D, generator=g, dtype=torch.float32) for _ in range(2))
    logs = {}
    for mech, degrees in CASES:
        fwd, bwd = [], []
        comm = Recording(fwd)
        plan = build_plan(
            mech, degrees, mask.slices, sharding, rank, HQ, HKV, rank_kernel("naive"), torch.device("cpu"), comm=comm
        )
        ql, kl, vl = (x[:, :, pos].clone().requires_grad_(True) for x in (q, k, v))
        out = cp_attention(ql, kl, vl, plan)
        comm.log = bwd
        out.backward(dout[:, :, pos])
        logs[mech] = {"fwd": fwd, "bwd": bwd}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(logs, f)
    rank_hits.save(out_dir)  # for the mutation score (tests/support/rank_hits.py)
    dist.destroy_process_group()


def _traced(mech: str, degrees, rank: int, pass_: str) -> list:
    mask = build_mask("causal", SEQLEN, {}, seed=0)
    sharding = make_sharding("zigzag", SEQLEN, WORLD, mask.slices)
    u, r, w = resolve_degrees(mech, WORLD, degrees)
    events = trace_rank(
        mech,
        degrees,
        mask.slices,
        sharding,
        rank,
        batch=BATCH,
        heads_q=HQ,
        heads_kv=HKV,
        head_dim=D,
        dtype=torch.float32,
        pass_=pass_,
        topo=Topology(WORLD, 0, u, r, w),
        cuts=step_cuts(mask.slices, sharding, u, r),
    )
    out = []
    for e in events:
        if isinstance(e, Post):
            out.append(["exchange", e.nbytes, [e.send_to, e.recv_from]])
        elif isinstance(e, Collective):
            out.append([e.kind, e.nbytes, None])
    return out


def test_each_mechanisms_trace_is_what_it_sends_on_gloo(tmp_path) -> None:
    mp.start_processes(_worker, args=(free_port(), str(tmp_path)), nprocs=WORLD, start_method="spawn")
    rank_hits.merge(tmp_path)
    for rank in range(WORLD):
        logs = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for mech, degrees in CASES:
            for pass_ in ("fwd", "bwd"):
                sent = logs[mech][pass_]
                assert sent, (mech, pass_)  # every mechanism communicates in both passes at 4 ranks
                assert _traced(mech, degrees, rank, pass_) == sent, (mech, pass_, rank)

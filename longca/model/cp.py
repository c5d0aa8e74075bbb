"""The CP model: each rank's per-iteration time for a CP cell on a described cluster.

1. Trace: every rank's schedule of one pass, from the mechanism's code (longca.cp.trace): its
   attention calls with their sub-masks, its exchanges (posted, then waited) and its blocking
   collectives, with the bytes each sends.
2. Compute: each attention call takes its FLOPs (longca.measure.flops) over the measured
   single-GPU rate of the same kernel for that step (longca.model.rates).
3. Communication: an exchange from rank a to b starts once both posted it and a's link is free,
   and takes latency + bytes / bandwidth of the link between their nodes (the cluster file); a
   rank's sends queue on its link in the order it posted them (a double ring's inner and outer
   exchanges share the rank's link instead of running side by side on two NCCL communicators).
   An all-to-all sends to every member at once (the inter-node share at the inter-node rate, the
   rest at the intra-node one); an all-gather or reduce-scatter
   runs NCCL's ring: n - 1 messages over the slowest link of the group.
4. Overlap as the code schedules it: a posted exchange runs while the rank computes, and only a
   wait blocks it (ring steps overlap their KV transfer, and in the backward the dK/dV transfer,
   with the next step's attention); a collective blocks every member until all arrived and it ended.

The ranks are simulated together (an exchange waits for its peer; a collective for its slowest
member), so load imbalance appears as waiting. Not modelled: the LSE combination and other local
work between calls, kernel launch gaps, link contention between different collectives of one
node, and NCCL protocol effects at small messages beyond the per-message latency.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from longca.cp.mechanisms import resolve_degrees, step_cuts
from longca.cp.sharding import make_sharding
from longca.cp.topology import Topology
from longca.cp.trace import Collective, Compute, Event, Post, Wait, trace_rank
from longca.kernels.base import Unsupported
from longca.measure.flops import attention_flops
from longca.model.cluster import Cluster
from longca.model.rates import Rates

DENSE_KINDS = ("full", "causal")  # masks whose steps take the full or the causal rate


@dataclass
class Timeline:
    """Simulated pass: `seconds` until the last rank is done, per rank its end time, its compute
    seconds and the bytes it sent."""

    seconds: float
    rank_seconds: list[float]
    rank_compute: list[float]
    rank_bytes: list[int]


def collective_seconds(cluster: Cluster, e: Collective) -> float:
    n = len(e.members)
    if e.kind == "all_to_all":
        per_dest = e.nbytes / (n - 1)
        me = e.members[0]
        local = sum(1 for m in e.members[1:] if cluster.node(m) == cluster.node(me))
        remote = n - 1 - local
        worst = max(
            local * per_dest / (cluster.intra.bandwidth_gbs * 1e9),
            remote * per_dest / (cluster.inter.bandwidth_gbs * 1e9),
        )
        link = cluster.group_link(e.members)
        return link.latency_us * 1e-6 + worst
    # all-gather / reduce-scatter: NCCL's ring, n - 1 steps over the group's slowest link
    return cluster.group_link(e.members).seconds(e.nbytes, messages=n - 1)


def simulate(
    traces: list[list[Event]], cluster: Cluster, step_seconds: Callable[[Compute], float], comm: bool = True
) -> Timeline:
    """Run every rank's trace together (see the module doc); `comm=False` makes every transfer
    free (what the iteration would take with communication hidden)."""
    world = len(traces)
    clock = [0.0] * world
    compute = [0.0] * world
    sent = [0] * world
    pos = [0] * world
    link_free = [0.0] * world
    posted: list[dict[int, tuple[float, Post]]] = [{} for _ in range(world)]
    arrival: dict[tuple[int, int], float] = {}  # (receiver, exchange n) -> time its data is there
    started: set[tuple[int, int]] = set()  # (sender, n) transfers already placed on the link
    coll_seq = [dict() for _ in range(world)]  # (kind, members) -> how many this rank has passed
    coll_in: dict[tuple, dict[int, float]] = {}  # collective instance -> member -> arrival time
    coll_end: dict[tuple, float] = {}

    def start_transfer(a: int, n: int) -> None:
        """Place exchange n from a on a's link once a and its receiver have both posted it and a's
        earlier exchanges are placed: a rank's sends leave in the order it posted them."""
        while (a, n) not in started and n in posted[a] and (n == 0 or (a, n - 1) in started):
            t_a, e = posted[a][n]
            b = e.send_to
            if n not in posted[b]:
                return
            t0 = max(t_a, posted[b][n][0], link_free[a])
            dur = cluster.link(a, b).seconds(e.nbytes) if comm else 0.0
            link_free[a] = t0 + dur
            arrival[(b, n)] = t0 + dur
            started.add((a, n))
            n += 1  # a later exchange of a's may have waited for this one

    done = 0
    while done < world:
        progress = False
        done = 0
        for r in range(world):
            trace = traces[r]
            while pos[r] < len(trace):
                e = trace[pos[r]]
                if isinstance(e, Compute):
                    dt = step_seconds(e)
                    clock[r] += dt
                    compute[r] += dt
                elif isinstance(e, Post):
                    posted[r][e.n] = (clock[r], e)
                    sent[r] += e.nbytes
                    start_transfer(r, e.n)
                    start_transfer(e.recv_from, e.n)
                elif isinstance(e, Wait):
                    # the data this rank waits for comes from the rank it receives from
                    src = posted[r][e.n][1].recv_from
                    start_transfer(src, e.n)
                    if (r, e.n) not in arrival:
                        break
                    clock[r] = max(clock[r], arrival[(r, e.n)])
                elif isinstance(e, Collective):
                    key = (e.kind, e.members)
                    inst = (*key, coll_seq[r].get(key, 0))
                    arrived = coll_in.setdefault(inst, {})
                    if r not in arrived:
                        arrived[r] = clock[r]
                        sent[r] += e.nbytes
                    if inst not in coll_end:
                        if len(arrived) < len(e.members):
                            break
                        coll_end[inst] = max(arrived.values()) + (collective_seconds(cluster, e) if comm else 0.0)
                    clock[r] = coll_end[inst]
                    coll_seq[r][key] = inst[-1] + 1
                pos[r] += 1
                progress = True
            done += pos[r] == len(trace)
        if done < world and not progress:
            stuck = [r for r in range(world) if pos[r] < len(traces[r])]
            raise RuntimeError(f"CP model: ranks {stuck[:8]} wait on each other (a trace without its peer's events)")
    return Timeline(max(clock), clock, compute, sent)


@dataclass(frozen=True)
class CellModel:
    """A modelled cell: the pass's timeline with and without communication, and its FLOPs."""

    timeline: Timeline
    compute_only: Timeline
    flops: float
    degrees: tuple[int, int, int]


def model_cell(cell, cluster: Cluster, rates: Rates, sample: int = 0) -> CellModel:
    """Trace every rank of a CP cell (longca.spec.cells.Cell with cp_mechanism set) for mask draw
    `sample` and simulate it on `cluster` with `rates`. Raises Unsupported for what cannot be
    modelled or run."""
    from longca.masks.registry import build_mask

    if cell.world_size > cluster.max_gpus:
        raise Unsupported(
            f"world size {cell.world_size} exceeds the cluster's {cluster.max_gpus} GPUs ({cluster.name})"
        )
    mask = build_mask(
        cell.mask, cell.seqlen, dict(cell.mask_params), seed=cell.seed, sample=sample, heads_kv=cell.heads_kv
    )
    if mask.per_head:
        raise Unsupported("block-sparse masks are not modelled (their steps are block lists, not slices)")
    world, degrees = cell.world_size, dict(cell.cp_degrees)
    u, r, w = resolve_degrees(cell.cp_mechanism, world, degrees)
    sharding = make_sharding(cell.cp_balance, cell.seqlen, world, mask.slices)
    cuts = step_cuts(mask.slices, sharding, u, r)
    topo = Topology(world, 0, u, r, w)
    import torch

    dtype = getattr(torch, cell.dtype)
    traces = [
        trace_rank(
            cell.cp_mechanism,
            degrees,
            mask.slices,
            sharding,
            rank,
            batch=cell.batch,
            heads_q=cell.heads_q,
            heads_kv=cell.heads_kv,
            head_dim=cell.head_dim,
            dtype=dtype,
            pass_=cell.pass_,
            topo=topo,
            cuts=cuts,
        )
        for rank in range(world)
    ]
    step = step_timer(cell, rates)
    flops = attention_flops(mask.area * cell.batch, cell.heads_q, cell.head_dim, cell.pass_)
    return CellModel(simulate(traces, cluster, step), simulate(traces, cluster, step, comm=False), flops, (u, r, w))


def step_timer(cell, rates: Rates) -> Callable[[Compute], float]:
    """Seconds of one traced attention call of `cell` at its measured rate (longca.model.rates)."""
    cache: dict[tuple, float] = {}

    def seconds(e: Compute) -> float:
        if e.area == 0:
            return 0.0
        kind = ("causal" if e.causal else "full") if cell.mask in DENSE_KINDS else cell.mask
        key = (kind, e.pass_, e.seqlen_q)
        if key not in cache:
            # the rate of the cell's own head grouping: a Ulysses rank's fewer heads run at the
            # per-head rate of the full head count (its kernel sees the same GQA group)
            cache[key] = rates.tflops(
                cell.kernel, kind, e.pass_, cell.heads_q, cell.heads_kv, cell.head_dim, cell.dtype, e.seqlen_q
            )
        f = attention_flops(e.area * cell.batch, e.heads_q, cell.head_dim, e.pass_)
        return f / (cache[key] * 1e12)

    return seconds


def rank_imbalance(values: list[float]) -> float:
    a = np.asarray(values, dtype=np.float64)
    return float(a.max() / a.mean() - 1) if len(a) and a.mean() > 0 else 0.0


# The columns of a model table: the cell's axes as in measured rows, then the model's figures.
MODEL_COLUMNS = (
    "source",
    "cluster",
    "assumptions",
    "spec",
    "sweep",
    "cell_digest",
    "kernel",
    "mask",
    "mask_variant",
    "seqlen_q",
    "heads_q",
    "heads_kv",
    "head_dim",
    "dtype",
    "pass",
    "batch",
    "world_size",
    "cp_mechanism",
    "cp_variant",
    "cp_degrees",
    "cp_balance",
    "tokens_per_gpu",
    "draws",
    "status",
    "reason",
    "median_ms",
    "tflops",
    "compute_ms",
    "comm_exposed_ms",
    "rank_ms",
    "rank_compute_ms",
    "rank_bytes_sent",
    "imbalance_time",
    "tflops_draws",
    "git_commit",
)


def model_row(cell, cluster: Cluster, rates: Rates, draws: int = 1, commit: str | None = None) -> dict:
    """One row of a model table (source = model) for a CP cell: ok with the modelled iteration
    time and per-GPU TFLOP/s, or unsupported with the reason (planning's, or the model's).
    A sampled mask (documents) is modelled for its first min(draws, the cell's samples) draws:
    the row holds the draw whose per-GPU TFLOP/s is the median (every draw's rate beside it),
    since one draw's documents can change the attended area per token many times over.
    `commit`: the code's commit as read once when the command started (default: read now)."""
    from longca.measure.env import git_commit
    from longca.run.rows import cell_columns
    from longca.run.serving import planned_unsupported

    row = {
        "source": "model",
        "cluster": cluster.name,
        "assumptions": f"{cluster.assumptions()}; compute at {rates.gpu} rates measured on one GPU",
        **cell_columns(cell),  # model_table keeps the columns it names
        "tokens_per_gpu": cell.seqlen // cell.world_size,
        "git_commit": commit or git_commit(),
    }
    reason = planned_unsupported(cell)
    models: list[CellModel] = []
    if reason is None:
        try:
            models = [model_cell(cell, cluster, rates, sample=s) for s in range(max(1, min(draws, cell.samples)))]
        except Unsupported as exc:
            reason = str(exc)
    if reason is not None:
        return {**row, "status": "unsupported", "reason": reason}
    per_gpu = [m.flops / cell.world_size / m.timeline.seconds / 1e12 for m in models]
    m = models[int(np.argsort(per_gpu)[(len(models) - 1) // 2])]  # the median draw by per-GPU rate
    t, c = m.timeline, m.compute_only
    return {
        **row,
        "draws": len(models),
        "status": "ok",
        "reason": None,
        "median_ms": t.seconds * 1e3,
        "tflops": m.flops / cell.world_size / t.seconds / 1e12,
        "compute_ms": c.seconds * 1e3,
        "comm_exposed_ms": (t.seconds - c.seconds) * 1e3,
        "rank_ms": [x * 1e3 for x in t.rank_seconds],
        "rank_compute_ms": [x * 1e3 for x in t.rank_compute],
        "rank_bytes_sent": t.rank_bytes,
        "imbalance_time": rank_imbalance(t.rank_compute),
        "tflops_draws": per_gpu,
    }


def model_table(rows: list[dict]):
    """A pyarrow table of model rows in MODEL_COLUMNS order."""
    import pyarrow as pa

    types = {
        "rank_ms": pa.list_(pa.float64()),
        "rank_compute_ms": pa.list_(pa.float64()),
        "rank_bytes_sent": pa.list_(pa.int64()),
        "tflops_draws": pa.list_(pa.float64()),
    }
    for c in ("seqlen_q", "heads_q", "heads_kv", "head_dim", "batch", "world_size", "tokens_per_gpu", "draws"):
        types[c] = pa.int64()
    for c in ("median_ms", "tflops", "compute_ms", "comm_exposed_ms", "imbalance_time"):
        types[c] = pa.float64()
    schema = pa.schema([(c, types.get(c, pa.string())) for c in MODEL_COLUMNS])
    return pa.Table.from_pylist([{c: r.get(c) for c in MODEL_COLUMNS} for r in rows], schema=schema)

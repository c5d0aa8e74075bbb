"""The five CP mechanisms as data, and the autograd Function that runs any of them.

Every mechanism is a (ulysses degree u) x (ring degree r) grid, optionally with the ring split
into windows, and a ring kind:

| mechanism      | u                 | r                | windows          | ring kind  |
| ulysses        | world             | 1                | 1                | -          |
| ring_p2p       | 1                 | world            | 1                | p2p        |
| ring_allgather | 1                 | world            | 1                | all-gather |
| usp            | degrees.ulysses   | degrees.ring     | 1                | p2p        |
| loongtrain     | degrees.ulysses   | degrees.ring     | degrees.windows  | p2p (double ring) |

Forward: replicate KV heads if needed, all-to-all to head sharding (u > 1), ring attention over
the ring participants (each participant's tokens = its Ulysses group's tokens), all-to-all back.
Backward is hand-written in the same order reversed (longca.cp.ring / allgather), never
autograd through collectives.

Block-sparse masks (kept blocks per KV head, no slices) pass `blocks=` to build_plan: each
(participant, participant) step gets its local BlockLayout cut from the global block lists
(longca.cp.submask.sub_layout), restricted to the KV heads this rank holds (all of them for
rings; its Ulysses share, after KV replication, otherwise), and the local kernel's
prepare_blocks; steps with no kept block are skipped like empty slice steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from longca.cp import allgather, ring, ulysses
from longca.cp.comm import Comm
from longca.cp.sharding import Sharding
from longca.cp.submask import layout_step_areas, layouts_of_groups, sub_layout, sub_mask
from longca.cp.topology import Topology
from longca.kernels import registry
from longca.kernels.base import Unsupported
from longca.kernels.rank import RankKernel, SubMask
from longca.masks import slices as sl
from longca.masks.blocks import BlockLayout


@dataclass(frozen=True)
class Mechanism:
    name: str
    ring_kind: str  # "p2p" | "allgather"
    uses_degrees: tuple[str, ...]  # keys of `degrees` it reads
    description: str


MECHANISMS: dict[str, Mechanism] = {
    m.name: m
    for m in (
        Mechanism("ulysses", "p2p", (), "all-to-all sequence <-> heads; full-sequence local attention"),
        Mechanism("ring_p2p", "p2p", (), "KV passed around the ring, overlapped with compute"),
        Mechanism("ring_allgather", "allgather", (), "one KV all-gather, reduce-scatter of dK/dV"),
        Mechanism("usp", "p2p", ("ulysses", "ring"), "Ulysses inside groups x ring across them"),
        Mechanism("loongtrain", "p2p", ("ulysses", "ring", "windows"), "Ulysses x double ring (windows)"),
    )
}


def resolve_degrees(mechanism: str, world: int, degrees: dict[str, int] | None) -> tuple[int, int, int]:
    """(ulysses, ring, windows) of a mechanism at a world size; bad values raise ValueError naming them."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}; allowed: {sorted(MECHANISMS)}")
    d = dict(degrees or {})
    unknown = set(d) - {"ulysses", "ring", "windows"}
    if unknown:
        raise ValueError(f"unknown degrees {sorted(unknown)}; allowed: ['ulysses', 'ring', 'windows']")
    if mechanism == "ulysses":
        u, r, w = world, 1, 1
    elif mechanism in ("ring_p2p", "ring_allgather"):
        u, r, w = 1, world, 1
    else:
        u = int(d.get("ulysses", 1))
        r = int(d.get("ring", world // max(u, 1)))
        w = int(d.get("windows", 1)) if mechanism == "loongtrain" else 1
    given = {k: v for k, v in d.items() if v is not None}
    for key, val in (("ulysses", u), ("ring", r), ("windows", w)):
        if key in given and int(given[key]) != val:
            raise ValueError(
                f"degrees.{key}={given[key]} does not fit mechanism {mechanism!r} at "
                f"world_size={world} (it uses {key}={val})"
            )
    if u < 1 or r < 1 or u * r != world:
        raise ValueError(f"degrees ulysses={u} x ring={r} must multiply to world_size={world}")
    if w < 1 or r % w:
        raise ValueError(
            f"degrees.windows={w} must divide the ring degree {r}; allowed: "
            f"{[x for x in range(1, r + 1) if r % x == 0]}"
        )
    return u, r, w


@dataclass
class Plan:
    """Everything one rank needs to run a mechanism on one mask: built once, outside timing."""

    mechanism: Mechanism
    topo: Topology
    kernel: RankKernel
    subs: list[SubMask]  # this rank's ring participant against every participant
    rep: int  # KV head replication for Ulysses
    comm: Comm
    # Attended pairs per head-equivalent of each world rank = rank_work[g] / work_den (one batch
    # element). Shared masks: work_den = 1. Per-KV-head masks: rank_work counts (query head, q, k)
    # triples the rank computes and work_den = heads_q, so that the ranks sum to the mean area per head.
    rank_work: list[int]
    work_den: int
    step_areas: np.ndarray  # (r, r): pairs between ring participants i (queries) and j (keys),
    #                         summed over KV heads for per-KV-head masks

    def rank_area(self, batch: int = 1) -> list[int]:
        """Integer attended area per rank for `batch` elements; rounded so that the ranks add up to
        round(batch x mean area per head) exactly (no rounding for shared masks)."""
        out, prev, cum = [], 0, 0
        for w in self.rank_work:
            cum += w
            now = round(Fraction(batch * cum, self.work_den))
            out.append(int(now - prev))
            prev = now
        return out

    @property
    def rank_areas(self) -> list[int]:
        """rank_area for one batch element."""
        return self.rank_area(1)

    def attend_fwd(self, q, k, v):
        if self.mechanism.ring_kind == "allgather":
            return allgather.allgather_fwd(q, k, v, self.subs, self.kernel, self.topo, self.comm)
        return ring.ring_fwd(q, k, v, self.subs, self.kernel, self.topo, self.comm)

    def attend_bwd(self, dout, q, k, v, out, lse):
        if self.mechanism.ring_kind == "allgather":
            return allgather.allgather_bwd(dout, q, k, v, out, lse, self.subs, self.kernel, self.topo, self.comm)
        return ring.ring_bwd(dout, q, k, v, out, lse, self.subs, self.kernel, self.topo, self.comm)


def build_plan(
    mechanism: str,
    degrees: dict[str, int] | None,
    slices: np.ndarray,
    sharding: Sharding,
    rank: int,
    heads_q: int,
    heads_kv: int,
    kernel: RankKernel,
    device: torch.device,
    comm: Comm | None = None,
    blocks: BlockLayout | None = None,
    topo: Topology | None = None,
    cuts: StepCuts | None = None,
) -> Plan:
    """Resolve degrees, create the groups, cut the mask for every (participant, participant) pair
    (on every rank, so support checks agree everywhere) and prepare this rank's sub-masks.
    `blocks`: the layout of a block-sparse mask (its `slices` are empty and ignored).
    `cuts`: `step_cuts` when already made (the CP model plans every rank from one).
    Raises Unsupported (same on every rank) for combinations that cannot run."""
    world = sharding.world_size
    u, r, w = resolve_degrees(mechanism, world, degrees)
    rep = ulysses.kv_replication(heads_q, heads_kv, u)
    if blocks is not None:  # checked before any group is created
        _check_blocks(blocks, kernel, sharding, heads_kv)
    # `topo`: a Topology without process groups, for one process playing one rank (LocalComm)
    topo = topo or Topology.build(world, rank, u, r, w)
    layouts = layouts_of_groups(sharding.intervals, [topo.uly_members(i) for i in range(r)])
    if blocks is not None:
        return _block_plan(mechanism, blocks, layouts, topo, rep, heads_q, heads_kv, kernel, device, comm)
    cuts = cuts or step_cuts(slices, sharding, u, r)
    cut, step_areas = cuts.slices, cuts.areas
    for row in cut:  # kernels that reject some slice kinds say so before anything runs
        for c in row:
            kernel.prepare_check(c)
    n = sum(e - s for s, e in layouts[0])
    subs = [kernel.prepare(c, n, n, device) for c in cut[topo.ring_index]]
    rank_areas = []
    for g in range(world):
        i, j = divmod(g, u)
        total = int(step_areas[i].sum())
        rank_areas.append(total // u + (1 if j < total % u else 0))
    return Plan(MECHANISMS[mechanism], topo, kernel, subs, rep, comm or Comm(), rank_areas, 1, step_areas)


@dataclass(frozen=True)
class StepCuts:
    """slices[i][j]: the sub-mask between ring participants i (queries) and j (keys); areas[i, j]
    its attended pairs."""

    slices: list[list[np.ndarray]]
    areas: np.ndarray


def step_cuts(slices: np.ndarray, sharding: Sharding, ulysses_degree: int, ring_degree: int) -> StepCuts:
    """The mask cut between every pair of ring participants, each participant holding its Ulysses
    group's tokens (global rank = ring index x ulysses + member)."""
    groups = [[i * ulysses_degree + j for j in range(ulysses_degree)] for i in range(ring_degree)]
    layouts = layouts_of_groups(sharding.intervals, groups)
    cut = [[sub_mask(slices, layouts[i], layouts[j]) for j in range(ring_degree)] for i in range(ring_degree)]
    return StepCuts(cut, np.array([[sl.area(c) for c in row] for row in cut], dtype=np.int64))


def refuse_blocks(kernel: RankKernel) -> None:
    """Raise Unsupported when `kernel` takes no block layouts (block-sparse masks), naming those that do."""
    if not kernel.takes_blocks:
        takers = [n for n in registry.rank_kernel_names() if registry.get(n).caps.cp.block_sparse]
        raise Unsupported(
            f"kernel {kernel.name!r} takes slice masks only as a CP per-rank kernel; block-sparse masks need "
            f"one of {takers}"
        )


def _check_blocks(blocks: BlockLayout, kernel: RankKernel, sharding: Sharding, heads_kv: int) -> None:
    refuse_blocks(kernel)
    if blocks.heads != heads_kv:  # never reuse one head's layout for another
        raise ValueError(
            f"the block-sparse mask has layouts for {blocks.heads} KV heads but heads_kv={heads_kv}; "
            f"build it with heads_kv={heads_kv}"
        )
    if int(blocks.q_bounds[-1]) != sharding.seqlen or int(blocks.k_bounds[-1]) != sharding.seqlen:
        raise ValueError(
            f"the block layout covers {int(blocks.q_bounds[-1])} x {int(blocks.k_bounds[-1])} "
            f"tokens but the sharding {sharding.seqlen}"
        )


def kv_heads_of_member(heads_kv: int, rep: int, u: int, j: int) -> np.ndarray:
    """Original KV head of each local KV head of Ulysses member j: KV heads are replicated rep
    times (repeat_interleave), then member j holds the j-th of u equal chunks."""
    n = heads_kv * rep // u
    return np.arange(j * n, (j + 1) * n, dtype=np.int64) // rep


def _block_plan(
    mechanism: str,
    blocks: BlockLayout,
    layouts,
    topo: Topology,
    rep: int,
    heads_q: int,
    heads_kv: int,
    kernel: RankKernel,
    device: torch.device,
    comm: Comm | None,
) -> Plan:
    u, r = topo.ulysses, topo.ring
    areas = layout_step_areas(blocks, layouts)  # (Hkv, r, r) exact, from per-block token counts
    hq_loc = heads_q // u
    group_loc = hq_loc // (heads_kv * rep // u)  # local query heads per local KV head
    mine = kv_heads_of_member(heads_kv, rep, u, topo.uly_index)
    i = topo.ring_index
    subs = [kernel.prepare_blocks(sub_layout(blocks, layouts[i], layouts[j], mine), hq_loc, device) for j in range(r)]
    rank_work = []
    for g in range(topo.world):
        ri, j = divmod(g, u)
        heads = kv_heads_of_member(heads_kv, rep, u, j)
        rank_work.append(int(group_loc * areas[heads, ri, :].sum()))
    return Plan(MECHANISMS[mechanism], topo, kernel, subs, rep, comm or Comm(), rank_work, heads_q, areas.sum(axis=0))


def cp_forward(plan: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
    """The forward of one rank, in the order its collectives run: KV replication, all-to-all to
    head sharding, the ring (or all-gather) attention, all-to-all back. Returns (this rank's
    output, the tensors its backward needs). `cp_attention` runs it under autograd; the CP model
    (longca.model) traces it with meta tensors, so both follow this one schedule."""
    t, c = plan.topo, plan.comm
    u, me, g = t.ulysses, t.uly_index, t.uly_group
    k = ulysses.replicate_kv(k, plan.rep)
    v = ulysses.replicate_kv(v, plan.rep)
    qh, kh, vh = (ulysses.seq_to_heads(x, u, me, g, c) for x in (q, k, v))
    out, lse = plan.attend_fwd(qh, kh, vh)
    out_h = out.to(q.dtype)
    return ulysses.heads_to_seq(out_h, u, me, g, c), (qh, kh, vh, out_h, lse)


def cp_backward(plan: Plan, saved, dout: torch.Tensor):
    """The backward of one rank from what `cp_forward` saved: (dq, dk, dv) in sequence sharding."""
    t, c = plan.topo, plan.comm
    u, me, g = t.ulysses, t.uly_index, t.uly_group
    qh, kh, vh, out_h, lse = saved
    doh = ulysses.seq_to_heads(dout.contiguous(), u, me, g, c)
    dq, dk, dv = plan.attend_bwd(doh, qh, kh, vh, out_h, lse)
    dq, dk, dv = (ulysses.heads_to_seq(x.to(qh.dtype), u, me, g, c) for x in (dq, dk, dv))
    return dq, ulysses.unreplicate_grad(dk, plan.rep), ulysses.unreplicate_grad(dv, plan.rep)


class _CPAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan: Plan):
        out, saved = cp_forward(plan, q, k, v)
        ctx.save_for_backward(*saved)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, dout):
        return (*cp_backward(ctx.plan, ctx.saved_tensors, dout), None)


def cp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan) -> torch.Tensor:
    """Context-parallel attention of this rank's shard: q (B, Hq, S_loc, D), k/v (B, Hkv, S_loc, D),
    tokens in the order of the plan's sharding. Returns this rank's output (B, Hq, S_loc, D)."""
    return _CPAttention.apply(q, k, v, plan)

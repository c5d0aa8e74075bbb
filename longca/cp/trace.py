"""One rank's CP schedule as a list of events, traced from the mechanism's own code.

`trace_rank` runs `cp_forward` / `cp_backward` (longca.cp.mechanisms) for one rank of a world
with tensors on the `meta` device (shapes and dtypes, no data, no process group): a
`RecordingKernel` records each attention call (its sub-mask's area and shape) and a
`RecordingComm` each collective with the bytes it would put on the wire and the ranks it involves.
Since the trace is the code that runs, a change to a mechanism's schedule changes its trace; the
CP model (longca.model.cp) turns traces into time. tests/cp/test_trace.py checks a trace
against what the same mechanism sends on gloo.

Events, in program order:
- `Compute(pass_, area, seqlen_q, seqlen_k, heads_q, heads_kv, causal)`: one local attention call;
- `Post(n, nbytes, send_to, recv_from)`: the n-th P2P exchange posted (sends overlap what follows);
- `Wait(n)`: the program waits for exchange n to arrive;
- `Collective(kind, nbytes, members)`: a blocking all-to-all, all-gather or reduce-scatter over
  `members` (global ranks); `nbytes` is what this rank sends (longca.cp.comm's counting).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from longca.cp.comm import Comm, Pending
from longca.cp.mechanisms import Plan, StepCuts, build_plan, cp_backward, cp_forward
from longca.cp.sharding import Sharding
from longca.cp.topology import Topology
from longca.kernels.rank import RankKernel, SubMask
from longca.masks import slices as sl

META = torch.device("meta")


@dataclass(frozen=True)
class Compute:
    pass_: str  # "fwd" | "bwd"
    area: int  # attended pairs of one head (one batch element)
    seqlen_q: int
    seqlen_k: int
    heads_q: int
    heads_kv: int
    causal: bool  # the sub-mask holds a causal slice (a diagonal step)


@dataclass(frozen=True)
class Post:
    n: int
    nbytes: int
    send_to: int
    recv_from: int


@dataclass(frozen=True)
class Wait:
    n: int


@dataclass(frozen=True)
class Collective:
    kind: str  # "all_to_all" | "all_gather" | "reduce_scatter"
    nbytes: int
    members: tuple[int, ...]


Event = Compute | Post | Wait | Collective


class RecordingKernel(RankKernel):
    """A per-rank kernel (longca.kernels.rank's interface) that computes nothing: it records each
    call and returns meta tensors of the right shapes."""

    name = "recording"

    def __init__(self, events: list, cuts: StepCuts | None = None) -> None:
        self.events = events
        # areas the cut already knows, by sub-mask object (planning asks for each of a rank's r)
        self.known = (
            {} if cuts is None else {id(c): a for row, arow in zip(cuts.slices, cuts.areas) for c, a in zip(row, arow)}
        )

    def prepare(self, slices: np.ndarray, seqlen_q: int, seqlen_k: int, device: torch.device) -> SubMask:
        area = self.known.get(id(slices))
        area = sl.area(slices) if area is None else int(area)
        return SubMask(slices, seqlen_q, seqlen_k, area, form=bool((slices[:, 4] == sl.Kind.CAUSAL).any()))

    def _record(self, pass_: str, q: torch.Tensor, k: torch.Tensor, sub: SubMask) -> None:
        self.events.append(Compute(pass_, sub.area, q.shape[2], k.shape[2], q.shape[1], k.shape[1], sub.form))

    def fwd_parts(self, q, k, v, sub):
        # no parts: the ring's LSE combination (local work the model does not time) is skipped,
        # which keeps a trace at 96 ranks to a few meta operations per step
        self._record("fwd", q, k, sub)
        return []

    def bwd(self, dout, q, k, v, out, lse, sub):
        self._record("bwd", q, k, sub)
        return (
            torch.empty_like(q, dtype=torch.float32),
            torch.empty_like(k, dtype=torch.float32),
            torch.empty_like(v, dtype=torch.float32),
        )


class _Posted(Pending):
    def __init__(self, bufs, events: list, n: int) -> None:
        super().__init__(bufs, None)
        self.events, self.n = events, n

    def wait(self):
        self.events.append(Wait(self.n))
        return self.bufs


class RecordingComm(Comm):
    """Comm that records instead of communicating; the members of each collective come from the
    topology (Ulysses groups for all-to-all, the ring for all-gather and reduce-scatter)."""

    def __init__(self, topo: Topology, events: list) -> None:
        super().__init__(enabled=True)
        self.topo, self.events, self.posts = topo, events, 0

    def exchange(self, tensors, send_to, recv_from, group):
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        self.bytes_sent += nbytes
        self.events.append(Post(self.posts, nbytes, send_to, recv_from))
        self.posts += 1
        return _Posted([torch.empty_like(t) for t in tensors], self.events, self.posts - 1)

    def _collective(self, kind: str, nbytes: int, members: list[int]) -> None:
        self.bytes_sent += nbytes
        self.events.append(Collective(kind, nbytes, tuple(members)))

    def all_to_all(self, chunks, me, group):
        if len(chunks) == 1:
            return chunks
        nbytes = sum(c.numel() * c.element_size() for j, c in enumerate(chunks) if j != me)
        self._collective("all_to_all", nbytes, self.topo.uly_members(self.topo.ring_index))
        return [torch.empty_like(c) for c in chunks]

    def _ring_members(self) -> list[int]:
        return [self.topo.ring_rank(i) for i in range(self.topo.ring)]

    def all_gather(self, t, n, group):
        if n == 1:
            return [t]
        self._collective("all_gather", (n - 1) * t.numel() * t.element_size(), self._ring_members())
        return [torch.empty_like(t) for _ in range(n)]

    def reduce_scatter(self, stacked, me, group):
        n = stacked.shape[0]
        if n == 1:
            return stacked[0]
        out = torch.empty(stacked.shape[1:], dtype=stacked.dtype, device=stacked.device)
        self._collective("reduce_scatter", (n - 1) * out.numel() * out.element_size(), self._ring_members())
        return out


def trace_rank(
    mechanism: str,
    degrees: dict[str, int] | None,
    slices: np.ndarray,
    sharding: Sharding,
    rank: int,
    *,
    batch: int,
    heads_q: int,
    heads_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    pass_: str,
    topo: Topology,
    cuts: StepCuts,
) -> list[Event]:
    """The events of `rank` for one pass ("fwd": the forward; "bwd": the backward alone, after an
    untraced forward). `topo` (without process groups) and `cuts` (longca.cp.mechanisms.step_cuts)
    are shared by every rank of the cell."""
    events: list[Event] = []
    rank_topo = Topology(topo.world, rank, topo.ulysses, topo.ring, topo.windows)
    comm = RecordingComm(rank_topo, events)
    kernel = RecordingKernel(events, cuts)
    plan: Plan = build_plan(
        mechanism,
        degrees,
        slices,
        sharding,
        rank,
        heads_q,
        heads_kv,
        kernel,
        META,
        comm=comm,
        topo=rank_topo,
        cuts=cuts,
    )
    n = sharding.local_len
    q = torch.empty(batch, heads_q, n, head_dim, dtype=dtype, device=META)
    k, v = (torch.empty(batch, heads_kv, n, head_dim, dtype=dtype, device=META) for _ in range(2))
    out, saved = cp_forward(plan, q, k, v)
    if pass_ == "fwd":
        return events
    if pass_ != "bwd":
        raise ValueError(f"pass {pass_!r}: allowed: fwd, bwd")
    del events[:]
    comm.posts = 0
    cp_backward(plan, saved, torch.empty_like(out))
    return events

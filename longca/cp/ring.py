"""Ring attention over the ring participants of a Topology, forward and hand-written backward.

KV travels around the ring while each rank attends its local queries to the KV it holds; the
partial results are combined by LSE. The backward passes KV again, with a dK/dV accumulator that
travels with it and returns to the KV's owner after a full turn; dQ stays local. Per-step
gradients use the global out/LSE (see longca.kernels.rank), so no autograd runs through collectives.

One engine serves both Ring P2P (one window: a plain ring) and LoongTrain's double ring
(`windows` > 1): KV first rotates inside a window of c = ring / windows participants (inner
ring), and the window's KV block moves to the next window (outer ring) concurrently.
Participant (w, t) = w * c + t holds, at outer step o and inner step s, the KV of participant
((w - o) mod windows) * c + (t - s) mod c.
"""

from __future__ import annotations

import torch

from longca.cp.comm import Comm
from longca.cp.topology import Topology
from longca.kernels.lse import Part, combine_parts, fold
from longca.kernels.rank import acc_dtype


def _schedule(topo: Topology):
    c = topo.window_size
    i = topo.ring_index
    w, t = divmod(i, c)
    n_w = topo.windows
    inner_next = topo.ring_rank(w * c + (t + 1) % c)
    inner_prev = topo.ring_rank(w * c + (t - 1) % c)
    outer_next = topo.ring_rank(((w + 1) % n_w) * c + t)
    outer_prev = topo.ring_rank(((w - 1) % n_w) * c + t)

    def source(o: int, s: int) -> int:
        return ((w - o) % n_w) * c + (t - s) % c

    return c, n_w, inner_next, inner_prev, outer_next, outer_prev, source


def ring_fwd(q, k, v, subs, kernel, topo: Topology, comm: Comm):
    """(out, lse) of local q against every participant's KV; subs[j] is the sub-mask vs participant j.
    out comes in q's dtype, lse in float32 (float64 for float64 inputs). Each step's result waits
    as parts in the kernel's dtype and is combined once at the end (longca.kernels.lse.combine_parts)."""
    c, n_w, i_next, i_prev, o_next, o_prev, source = _schedule(topo)
    b, h, sq, _ = q.shape
    shape, a = (b, h, sq, v.shape[-1]), acc_dtype(q.dtype)
    parts: list[Part] = []
    kv_outer = [k, v]
    for o in range(n_w):
        outer = comm.exchange(kv_outer, o_next, o_prev, topo.outer_group) if o < n_w - 1 else None
        kv = kv_outer
        for s in range(c):
            inner = comm.exchange(kv, i_next, i_prev, topo.inner_group) if s < c - 1 else None
            sub = subs[source(o, s)]
            if not sub.empty:
                parts = fold(parts + kernel.fwd_parts(q, kv[0], kv[1], sub), shape, a, q.device)
            if inner is not None:
                kv = inner.wait()
        if outer is not None:
            kv_outer = outer.wait()
    return combine_parts(parts, shape, q.dtype, a, q.device)


def ring_bwd(dout, q, k, v, out, lse, subs, kernel, topo: Topology, comm: Comm):
    """(dq, dk, dv) for local q, k, v; dK/dV accumulators (float32+) travel with the KV."""
    c, n_w, i_next, i_prev, o_next, o_prev, source = _schedule(topo)
    a = acc_dtype(q.dtype)
    dq = torch.zeros(q.shape, device=q.device, dtype=a)
    kv_outer = [k, v]
    d_outer_pending = None  # accumulator for kv_outer arriving from the previous window
    for o in range(n_w):
        outer = comm.exchange(kv_outer, o_next, o_prev, topo.outer_group) if o < n_w - 1 else None
        kv = kv_outer
        dkv = [torch.zeros(k.shape, device=k.device, dtype=a), torch.zeros(v.shape, device=v.device, dtype=a)]
        d_inner = None  # accumulator of the KV now held, in flight from the previous participant
        for s in range(c):
            inner = comm.exchange(kv, i_next, i_prev, topo.inner_group) if s < c - 1 else None
            sub = subs[source(o, s)]
            grads = None if sub.empty else kernel.bwd(dout, q, kv[0], kv[1], out, lse, sub)
            if d_inner is not None:  # waited after this step's compute: the transfer overlapped it
                dkv = d_inner.wait()
            if grads is not None:
                dq += grads[0]
                dkv[0] += grads[1]
                dkv[1] += grads[2]
            if c > 1:  # the accumulator follows its KV; after c sends it is back with its holder
                d_inner = comm.exchange(dkv, i_next, i_prev, topo.inner_group)
            if inner is not None:
                kv = inner.wait()
        if d_inner is not None:
            dkv = d_inner.wait()
        if d_outer_pending is not None:
            got = d_outer_pending.wait()
            dkv = [dkv[0] + got[0], dkv[1] + got[1]]
        if n_w > 1:  # window contribution joins the accumulator travelling with this KV block
            d_outer_pending = comm.exchange(dkv, o_next, o_prev, topo.outer_group)
        if outer is not None:
            kv_outer = outer.wait()
    if n_w > 1:
        dkv = d_outer_pending.wait()
    return dq, dkv[0], dkv[1]

"""Ring all-gather attention (Llama-3 style): one all-gather of KV over the ring group, local
attention against each participant's KV chunk (its sub-mask), and in the backward a second
all-gather (KV is not kept between passes) and one reduce-scatter of the dK/dV chunks."""

from __future__ import annotations

import torch

from longca.cp.comm import Comm
from longca.cp.topology import Topology
from longca.kernels.lse import Part, combine_parts, fold
from longca.kernels.rank import acc_dtype


def allgather_fwd(q, k, v, subs, kernel, topo: Topology, comm: Comm):
    """(out in q's dtype, lse in float32 / float64), the steps' parts combined once (as ring_fwd)."""
    r = topo.ring
    ks = comm.all_gather(k, r, topo.ring_group)
    vs = comm.all_gather(v, r, topo.ring_group)
    b, h, sq, _ = q.shape
    shape, a = (b, h, sq, v.shape[-1]), acc_dtype(q.dtype)
    parts: list[Part] = []
    for j in range(r):
        if not subs[j].empty:
            parts = fold(parts + kernel.fwd_parts(q, ks[j], vs[j], subs[j]), shape, a, q.device)
    return combine_parts(parts, shape, q.dtype, a, q.device)


def allgather_bwd(dout, q, k, v, out, lse, subs, kernel, topo: Topology, comm: Comm):
    r = topo.ring
    ks = comm.all_gather(k, r, topo.ring_group)
    vs = comm.all_gather(v, r, topo.ring_group)
    a = acc_dtype(q.dtype)
    dq = torch.zeros(q.shape, device=q.device, dtype=a)
    dk = torch.zeros((r, *k.shape), device=k.device, dtype=a)
    dv = torch.zeros((r, *v.shape), device=v.device, dtype=a)
    for j in range(r):
        if not subs[j].empty:
            gq, gk, gv = kernel.bwd(dout, q, ks[j], vs[j], out, lse, subs[j])
            dq += gq
            dk[j] += gk
            dv[j] += gv
    me = topo.ring_index
    return dq, comm.reduce_scatter(dk, me, topo.ring_group), comm.reduce_scatter(dv, me, topo.ring_group)

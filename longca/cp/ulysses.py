"""Ulysses: all-to-all from sequence-sharded to head-sharded tensors and back.

Inside a Ulysses group of u ranks, member j ends up with heads [j H/u, (j+1) H/u) over the
concatenation of every member's tokens (member order), runs attention over that whole sequence,
and sends the output back. Query heads must divide by u. KV heads either divide by u or are
replicated up to u (u a multiple of Hkv): q head h uses KV head h // (Hq/Hkv) either way.
"""

from __future__ import annotations

import torch

from longca.cp.comm import Comm
from longca.kernels.base import Unsupported


def kv_replication(heads_q: int, heads_kv: int, u: int) -> int:
    """How many times each KV head is repeated before the all-to-all (1: none). Raises
    Unsupported naming heads and degree when they do not divide."""
    if heads_q % u:
        raise Unsupported(f"heads_q={heads_q} is not divisible by the Ulysses degree {u}")
    if heads_q % heads_kv:
        raise Unsupported(f"heads_q={heads_q} is not a multiple of heads_kv={heads_kv}")
    if heads_kv >= u:
        if heads_kv % u:
            raise Unsupported(f"heads_kv={heads_kv} is not divisible by the Ulysses degree {u}")
        return 1
    if u % heads_kv:
        raise Unsupported(
            f"heads_kv={heads_kv} < Ulysses degree {u} and does not divide it, so KV heads cannot be replicated evenly"
        )
    return u // heads_kv


def seq_to_heads(x: torch.Tensor, u: int, me: int, group, comm: Comm) -> torch.Tensor:
    """(B, H, S_loc, D) sequence-sharded -> (B, H/u, u S_loc, D) head-sharded."""
    if u == 1:
        return x
    got = comm.all_to_all(list(x.chunk(u, dim=1)), me, group)
    return torch.cat(got, dim=2)


def heads_to_seq(y: torch.Tensor, u: int, me: int, group, comm: Comm) -> torch.Tensor:
    """(B, H/u, u S_loc, D) head-sharded -> (B, H, S_loc, D) sequence-sharded."""
    if u == 1:
        return y
    got = comm.all_to_all(list(y.chunk(u, dim=2)), me, group)
    return torch.cat(got, dim=1)


def replicate_kv(x: torch.Tensor, rep: int) -> torch.Tensor:
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def unreplicate_grad(g: torch.Tensor, rep: int) -> torch.Tensor:
    if rep == 1:
        return g
    b, h, s, d = g.shape
    return g.view(b, h // rep, rep, s, d).sum(2)

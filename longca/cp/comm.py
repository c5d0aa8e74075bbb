"""The collectives context parallelism uses, with bytes counted and a communication-free mode.

Counted bytes are what this rank puts on the wire for one call under the usual algorithms:
p2p sends their tensors; all-to-all sends the (u-1)/u of its buffer that leaves the rank;
all-gather and reduce-scatter (ring algorithm) send (n-1) chunks of the per-rank size.

With `enabled=False` every call returns correctly shaped local data without communicating: the
mechanism then runs exactly its local attention calls, which is how exposed communication is
measured (iteration time minus the time of the same iteration without communication).

Overlap: P2P exchanges are posted (batch_isend_irecv) before the step's attention and waited
after it; NCCL runs them on its own streams, so transfers overlap the attention kernels.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class Pending:
    def __init__(self, bufs: list[torch.Tensor], reqs) -> None:
        self.bufs = bufs
        self.reqs = reqs

    def wait(self) -> list[torch.Tensor]:
        for r in self.reqs or ():
            r.wait()
        return self.bufs


class Comm:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.bytes_sent = 0

    def exchange(self, tensors: list[torch.Tensor], send_to: int, recv_from: int, group) -> Pending:
        """Post: send `tensors` to global rank send_to, receive same-shaped ones from recv_from."""
        if not self.enabled:
            return Pending(list(tensors), None)
        tensors = [t.contiguous() for t in tensors]
        bufs = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, send_to, group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, b, recv_from, group) for b in bufs]
        self.bytes_sent += sum(t.numel() * t.element_size() for t in tensors)
        return Pending(bufs, dist.batch_isend_irecv(ops))

    def all_to_all(self, chunks: list[torch.Tensor], me: int, group) -> list[torch.Tensor]:
        """chunks[j] goes to group member j; returns what member j sent to this rank."""
        if not self.enabled or len(chunks) == 1:
            return [chunks[me]] * len(chunks)
        chunks = [c.contiguous() for c in chunks]
        outs = [torch.empty_like(c) for c in chunks]
        dist.all_to_all(outs, chunks, group=group)
        self.bytes_sent += sum(c.numel() * c.element_size() for j, c in enumerate(chunks) if j != me)
        return outs

    def all_gather(self, t: torch.Tensor, n: int, group) -> list[torch.Tensor]:
        if not self.enabled or n == 1:
            return [t] * n
        t = t.contiguous()
        flat = torch.empty((n * t.shape[0], *t.shape[1:]), dtype=t.dtype, device=t.device)
        dist.all_gather_into_tensor(flat, t, group=group)  # concatenated along dim 0
        self.bytes_sent += (n - 1) * t.numel() * t.element_size()
        return list(flat.chunk(n, dim=0))

    def reduce_scatter(self, stacked: torch.Tensor, me: int, group) -> torch.Tensor:
        """stacked (n, ...): returns the sum over ranks of stacked[me]."""
        n = stacked.shape[0]
        if not self.enabled or n == 1:
            return stacked[me]
        out = torch.empty(stacked.shape[1:], dtype=stacked.dtype, device=stacked.device)
        # (n, B, ...) -> (n B, ...): the dim-0 concatenation reduce_scatter_tensor splits evenly
        dist.reduce_scatter_tensor(out, stacked.reshape(-1, *stacked.shape[2:]).contiguous(), group=group)
        self.bytes_sent += (n - 1) * out.numel() * out.element_size()
        return out


class LocalComm(Comm):
    """Every ring participant's K/V held by one process, served as the forward's exchanges would
    deliver them: one rank's Ring P2P or Ring all-gather forward then runs on one device, without
    a process group, with exactly its own attention calls on the right data (its output can be
    checked against the reference). For measuring a rank's local work where only one GPU exists;
    nothing is sent, so `bytes_sent` stays 0. Plain rings only (no Ulysses, one window), forward only.
    `kv_of[j]` = (k, v) of participant j; `me` = this rank's participant index."""

    def __init__(self, kv_of: list[tuple[torch.Tensor, torch.Tensor]], me: int) -> None:
        super().__init__(enabled=True)
        self.kv_of, self.me = kv_of, me
        self._held = {id(kv[0]): j for j, kv in enumerate(kv_of)}

    def exchange(self, tensors: list[torch.Tensor], send_to: int, recv_from: int, group) -> Pending:
        j = self._held.get(id(tensors[0]))
        if j is None or len(tensors) != 2:
            raise ValueError("LocalComm serves the forward's K/V exchanges only (no backward accumulators)")
        # the previous participant holds, at every step, the KV one further back in the ring
        return Pending(list(self.kv_of[(j - 1) % len(self.kv_of)]), None)

    def all_to_all(self, chunks: list[torch.Tensor], me: int, group) -> list[torch.Tensor]:
        if len(chunks) > 1:
            raise ValueError("LocalComm has no Ulysses all-to-all (ulysses degree 1 only)")
        return chunks

    def all_gather(self, t: torch.Tensor, n: int, group) -> list[torch.Tensor]:
        if id(t) in self._held:
            return [kv[0] for kv in self.kv_of]
        if any(t is kv[1] for kv in self.kv_of):
            return [kv[1] for kv in self.kv_of]
        raise ValueError("LocalComm gathers the participants' K or V only")

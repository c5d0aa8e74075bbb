"""Kernel time apart from launch time: a call captured once in a CUDA graph, then replayed.

Eager timing includes the host's work per call (Python, argument checks, launches); at short
lengths that is most of it (FA4's 1K forward: 0.126 ms timed where its kernels need about 0.05).
Users who capture graphs or compile never pay it. `capture` records a call in a CUDA graph (after
warm-up calls on a side stream, as PyTorch requires); the one Timer then times `replay` under the
same protocol as the eager calls, so a row can carry both. A call that cannot be captured (host
synchronisation, CPU-side control flow, allocations a graph cannot replay) says why instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

WARMUP = 3  # calls on the side stream before capture (lazy initialisation, autotuning, compile)


class Captured:
    """A captured call: `replay()` runs it again; `release()` frees the graph's memory pool."""

    def __init__(self, graph: torch.cuda.CUDAGraph) -> None:
        self.graph = graph

    def replay(self) -> None:
        self.graph.replay()

    def release(self) -> None:
        self.graph.reset()


def capture(fn: Callable[[], object], device: torch.device) -> tuple[Captured | None, str | None]:
    """(captured call, None), or (None, why not): the reason names the exception the capture
    raised, or the device that has no CUDA graphs."""
    if device.type != "cuda":
        return None, f"no CUDA graphs on {device.type}"
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.stream(side):
            for _ in range(WARMUP):
                fn()
        torch.cuda.current_stream(device).wait_stream(side)
        with torch.cuda.graph(graph):
            fn()
    except Exception as exc:  # the capture ended with the exception: the stream is usable again
        torch.cuda.synchronize(device)
        return None, f"not capturable in a CUDA graph: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    torch.cuda.synchronize(device)
    return Captured(graph), None

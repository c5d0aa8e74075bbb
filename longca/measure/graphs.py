"""Kernel time apart from launch time: a call captured once in a CUDA graph, then replayed.

Eager timing includes the host's work per call (Python, argument checks, launches); at short
lengths that is most of it (FA4's 1K forward: 0.126 ms timed where its kernels need about 0.05).
Users who capture graphs or compile never pay it. `capture` records a call in a CUDA graph (after
warm-up calls on a side stream, as PyTorch requires); the one Timer then times `replay` under the
same protocol as the eager calls, so a row can carry both. A call that cannot be captured (host
synchronisation, CPU-side control flow, allocations a graph cannot replay) says why instead.

A backward is captured like any call, with one condition: autograd runs each backward op on the
stream its forward op ran on, so the forward whose graph the captured backward walks must have run
on the capturing stream (`prepare`; PyTorch's `make_graphed_callables` captures both on one stream
for the same reason).
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

WARMUP = 3  # calls on the side stream before capture (lazy initialisation, autotuning, compile)
# Captures tried per call, each in its CUDA stream-capture mode: first "thread_local" (an unsafe CUDA
# call, such as cudaMalloc or a query of another stream, ends the capture only when the capturing
# thread makes it), as Inductor's CUDA graphs capture, since autograd runs a backward's ops in a
# thread of its own; then "relaxed" (no such call ends it). No mode lets work that escaped the graph
# pass for it: a replay must reproduce the eager results from NaN (`Captured.replayed`,
# longca.run.cell.graph_columns). A backward's first capture per process failed in every mode
# (global, then these two); leaves of its own are the fix meant for that (longca.run.cell._graph_pass).
CAPTURE_MODES = ("thread_local", "relaxed")
ATTEMPTS = len(CAPTURE_MODES)


class CaptureRetryWarning(RuntimeWarning):
    """A capture attempt failed and the next one follows: the record of what failed where the
    retry then succeeds (a sweep's log, `benchmarks/graph_capture_survey.py`'s lines)."""


class Captured:
    """A captured call: `replay()` runs it again; `outputs` are the tensors the captured call
    returned, which every replay rewrites; `release()` frees the graph's memory pool."""

    def __init__(self, graph: torch.cuda.CUDAGraph, outputs: list[torch.Tensor], device: torch.device) -> None:
        self.graph = graph
        self.outputs = outputs
        self.device = device

    def replay(self) -> None:
        self.graph.replay()

    def replayed(self) -> list[torch.Tensor]:
        """The outputs of one replay, each set to NaN before it: a value the replay did not write
        stays NaN, so work that ran outside the capture (a kernel launched on another stream, a
        result kept on the host side) cannot pass for the call's."""
        for t in self.outputs:
            if t.is_floating_point():
                t.fill_(float("nan"))
        self.replay()
        torch.cuda.synchronize(self.device)
        return self.outputs

    def release(self) -> None:
        torch.cuda.synchronize(self.device)  # no replay still reads what the caller frees next
        self.outputs = []
        self.graph.reset()


def capture(
    fn: Callable[[], object], device: torch.device, prepare: Callable[[], object] | None = None
) -> tuple[Captured | None, str | None]:
    """(captured call, None), or (None, why not): the reason names the exception the capture
    raised (in the last of ATTEMPTS), or the device that has no CUDA graphs. `prepare()`, if given,
    runs before each attempt's warm-up on the stream the capture uses, neither timed nor captured
    (a backward's forward)."""
    if device.type != "cuda":
        return None, f"no CUDA graphs on {device.type}"
    reason = None
    for attempt, mode in enumerate(CAPTURE_MODES, start=1):
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        graph = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()  # named here, so that a failed capture's pool can be freed
        outputs: list[torch.Tensor] = []
        try:
            with torch.cuda.stream(side):
                if prepare is not None:
                    prepare()
                for _ in range(WARMUP):
                    fn()
            torch.cuda.current_stream(device).wait_stream(side)
            with torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode=mode):
                outputs = [t for t in tree_leaves(fn()) if isinstance(t, torch.Tensor)]
        except Exception as exc:  # the capture ended with the exception: the stream is usable again
            reason = f"not capturable in a CUDA graph: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
        else:
            torch.cuda.synchronize(device)
            return Captured(graph, outputs, device), None
        # after the except clause, whose exception (and the frames its traceback holds) is gone
        torch.cuda.synchronize(device)
        del graph, outputs
        _free_pool(device, pool)
        _end_generator_capture(device)
        if attempt < ATTEMPTS:
            warnings.warn(
                f"capture attempt {attempt} of {ATTEMPTS} ({mode} mode) failed: {reason}", CaptureRetryWarning, 2
            )
    return None, reason


# Pools of failed captures that still hold memory after _free_pool: the process should end after
# its cell (longca.run.worker restarts it), since no later cell can use that memory.
_held: set[tuple[int, int]] = set()


def _free_pool(device: torch.device, pool: tuple[int, int]) -> None:
    """Give back the memory pool of a capture that failed. PyTorch up to at least 2.11 keeps it
    for the life of the process: its CUDAGraph releases a pool only after a capture that completed
    (pytorch/pytorch#190348). On the H200, two failed captures of 256K linear-attention cells held
    139.5 GiB, and every later cell of the process ran out of memory. Its failed end also skipped
    ending the allocator's capture (`endAllocateToPool`), which is done here first. Where the graph
    released the pool (a PyTorch with that fix), `empty_cache` frees it and nothing more is done."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        # A capture whose end failed never told the allocator it ended: while the allocator counts
        # a capture underway it defers every freed block's reuse, and `empty_cache` frees none of
        # them (on the H100, each failed capture of a 256 MiB call then held 256 MiB more).
        torch._C._cuda_endAllocateToPool(index, pool)
    except RuntimeError:  # "not currently recording to mempool_id": the capture's end told it
        pass
    gc.collect()  # the capture's tensors may be held in reference cycles
    torch.cuda.empty_cache()
    state = pool_state(torch.cuda.memory_snapshot(), pool)
    if state == "leaked":
        torch._C._cuda_releasePool(index, pool)  # the reference the failed capture kept
        torch.cuda.empty_cache()
        state = pool_state(torch.cuda.memory_snapshot(), pool)
    if state != "free":
        _held.add(pool)


def pool_state(segments: list[dict[str, Any]], pool: tuple[int, int]) -> str:
    """What a memory snapshot (`torch.cuda.memory_snapshot()`, after `empty_cache`) says of a
    pool: "free" (no segment left), "leaked" (segments that hold no tensor: only a pool reference
    keeps them, since `empty_cache` frees an unreferenced pool's free segments) or "in use" (some
    tensor still lives in it; releasing the pool's reference then could release it twice)."""
    mine = [s for s in segments if tuple(s["segment_pool_id"]) == tuple(pool)]
    if not mine:
        return "free"
    return "in use" if any(s["allocated_size"] for s in mine) else "leaked"


def held_by_failed_captures() -> int:
    """Bytes that failed captures of this process still hold (0 on a machine without CUDA)."""
    if not _held or not torch.cuda.is_available():
        return 0
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) in _held)


def _end_generator_capture(device: torch.device) -> None:
    """A capture that fails leaves the device's default random generator in capture mode (PyTorch
    ends it only when a capture completes), and every later draw from it then fails ("Offset
    increment outside graph capture encountered unexpectedly": seen on an H100 with torch 2.11, in
    the next test's torch.randn; Inductor's autotuning draws its inputs from it). One trivial
    capture that completes ends it."""
    side = torch.cuda.Stream(device)
    scratch = torch.zeros(1, device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        scratch.add_(1)
    torch.cuda.synchronize(device)
    graph.reset()

"""One timer interface, two clocks: CUDA events on the GPU, a monotonic clock on the CPU.

Protocol (docs/measurement.md): warm-up iterations (capped by a count and, optionally, a time budget
`warmup_s`, as triton's do_bench does), then timed iterations capped by a count AND a time budget,
an L2 flush before each timed iteration on the GPU, median / p20 / p80 and every sample kept.

The first warm-up iteration also measures compilation: JIT kernels (FlexAttention, FA4, Triton)
compile on their first call at a shape, so its wall time beyond a steady iteration's is `compile_s`.
Adapters need no warm-up calls of their own (at 256K one FlexAttention call takes seconds).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from longca.measure.stats import LONG_CALL_MS, MedianCI, median_ci, min_samples

L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current GPU's L2 (H200: 60 MB)
# Suffix of a row's `timer` when its backward samples all ran on one forward's retained graph
# (`repeat.backward: retained_graph`) instead of after a fresh forward each.
RETAINED_GRAPH = "+retained_graph"


@dataclass
class Timing:
    samples_ms: list[float]
    warmup_iters: int
    timed_iters: int
    timer: str
    l2_flush: bool
    kernel_s: float = 0.0  # summed timed kernel time (sweep efficiency)
    compile_s: float = 0.0  # first warm-up iteration's wall time beyond a steady iteration's
    warmup_wall_s: float = 0.0  # wall time of the warm-up iterations (compile_s included)
    wall_s: float = 0.0  # wall time of the whole timer call: warm-up, `before` calls, flushes, timed calls
    extra: dict = field(default_factory=dict)
    ci_target: float | None = None  # the relative half-width the adaptive protocol sampled for

    @property
    def ci(self) -> MedianCI:
        """The distribution-free 95% interval of the median (longca.measure.stats)."""
        return median_ci(self.samples_ms)

    @property
    def ci_met(self) -> bool | None:
        """Whether the interval reached the target (None without one)."""
        if self.ci_target is None:
            return None
        ci = self.ci
        return ci.covered and ci.half_width(self.median_ms) <= self.ci_target

    @property
    def median_ms(self) -> float:
        return float(np.median(self.samples_ms))

    @property
    def p20_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 20))

    @property
    def p80_ms(self) -> float:
        return float(np.percentile(self.samples_ms, 80))


def time_under(timer, fn: Callable[[], object], repeat: dict, before: Callable[[], None] | None = None) -> Timing:
    """`fn` timed by `timer` under a sweep's repeat protocol (the keys of a spec's `repeat`)."""
    return timer.time(
        fn,
        warmup=repeat["warmup"],
        iters=repeat["iters"],
        min_iters=repeat.get("min_iters", 1),
        budget_s=repeat["budget_s"],
        warmup_s=repeat.get("warmup_s"),
        before=before,
        ci_target=repeat.get("ci_target"),
    )


def _plan_iters(first_ms: float, iters: int, min_iters: int, budget_s: float) -> int:
    by_budget = int(budget_s * 1000.0 / max(first_ms, 1e-6))
    return max(min_iters, min(iters, by_budget))


class Timer:
    """Warm-up, then timed iterations capped by count and budget; subclasses time one call.

    `_start_one` runs one timed call and returns a handle, `_elapsed_ms` reads it back. The first
    timed call is read at once (it sets the iteration count from the budget); the rest are only
    read after the last one was issued, so a GPU timer keeps the device queue full instead of
    waiting for each call before issuing the next (what triton's do_bench does too).
    """

    name = "abstract"
    l2_flush = False

    def _start_one(self, fn: Callable[[], object]) -> object:
        raise NotImplementedError

    def _elapsed_ms(self, handle: object) -> float:
        raise NotImplementedError

    def _sync(self) -> None:
        pass

    def _agree(self, value: float) -> float:
        """The value every process of a group acts on (the max over ranks; a lone process's own):
        decisions that end a loop must be the same on every rank, or the next collective hangs."""
        return value

    def time(
        self,
        fn: Callable[[], object],
        *,
        warmup: int,
        iters: int,
        min_iters: int = 1,
        budget_s: float = 10.0,
        before: Callable[[], None] | None = None,
        warmup_s: float | None = None,
        ci_target: float | None = None,
    ) -> Timing:
        """`warmup` iterations at most; with `warmup_s`, stop once one ran and they took >= warmup_s.

        Timed calls: without `ci_target`, as many as `budget_s` allows at the first call's pace,
        between `min_iters` and `iters`. With `ci_target` (adaptive): in batches, each as large as
        the samples so far, until the 95% interval of the median is within +-ci_target of it, or
        `iters` calls, or `budget_s` of timed wall time; never fewer than `min_iters`, nor fewer than
        the interval needs (6; 3 for calls over 1 s, whose interval then stays the full range)."""
        if warmup_s is not None and not warmup_s > 0:
            raise ValueError(f"warmup_s must be positive, got {warmup_s!r}")
        t_start = time.perf_counter()
        first_wall = None
        warmed = 0
        for i in range(warmup):
            t0 = time.perf_counter()
            if before:
                before()
            fn()
            warmed += 1
            if i == 0 or warmup_s is not None:
                self._sync()  # the budget must see device time, not launch time
            if i == 0:
                first_wall = time.perf_counter() - t0
            if warmup_s is not None and self._agree(float(time.perf_counter() - t_start >= warmup_s)):
                break
        self._sync()
        warmup_wall = time.perf_counter() - t_start
        t0 = time.perf_counter()
        if before:
            before()
        first = self._elapsed_ms(self._start_one(fn))  # waits for the call: a steady iteration's wall
        steady_wall = time.perf_counter() - t0
        if ci_target is None:
            n = _plan_iters(self._agree(first), iters, min_iters, budget_s)
            samples = [first] + self._batch(fn, n - 1, before)
        else:
            samples = self._adaptive(fn, first, t0, iters, min_iters, budget_s, ci_target, before)
        compile_s = max(first_wall - steady_wall, 0.0) if first_wall is not None else 0.0
        return Timing(
            samples,
            warmed,
            len(samples),
            self.name,
            self.l2_flush,
            kernel_s=sum(samples) / 1000.0,
            compile_s=compile_s,
            warmup_wall_s=warmup_wall,
            wall_s=time.perf_counter() - t_start,
            ci_target=ci_target,
        )

    def _batch(self, fn: Callable[[], object], n: int, before: Callable[[], None] | None) -> list[float]:
        """`n` timed calls issued back to back, then read (the last read waits for the device)."""
        handles = []
        for _ in range(n):
            if before:
                before()
            handles.append(self._start_one(fn))
        return [self._elapsed_ms(h) for h in handles]

    def _adaptive(
        self,
        fn: Callable[[], object],
        first: float,
        t_first: float,
        iters: int,
        min_iters: int,
        budget_s: float,
        ci_target: float,
        before: Callable[[], None] | None,
    ) -> list[float]:
        """Timed calls until the median's 95% interval is within +-ci_target (see `time`)."""
        if not 0 < ci_target < 1:
            raise ValueError(f"ci_target must be in (0, 1), got {ci_target!r}")
        floor = max(min_iters, 3 if self._agree(first) >= LONG_CALL_MS else min_samples())
        samples = [first]
        batch = min(floor, iters) - 1
        while True:
            samples += self._batch(fn, max(batch, 0), before)
            spent = time.perf_counter() - t_first
            ci = median_ci(samples)
            med = float(np.median(samples))
            done = len(samples) >= floor and ci.covered and ci.half_width(med) <= ci_target
            more = not done and len(samples) < iters and spent < budget_s
            # every rank of a group takes the same decision (any rank wanting more: all continue)
            if not self._agree(1.0 if more else 0.0):
                return samples
            pace = spent / len(samples)
            left = int((budget_s - spent) / max(pace, 1e-9))
            # Agreed too (the smallest): each rank sees its own `spent`, so their budgets left differ,
            # and a rank issuing more calls than another would take its barrier to their all-reduce.
            batch = int(-self._agree(-float(max(1, min(len(samples), iters - len(samples), left)))))


class CpuTimer(Timer):
    """time.perf_counter around each call; numbers for pipeline tests, not for publishing."""

    name = "cpu_monotonic"

    def _start_one(self, fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1000.0

    def _elapsed_ms(self, handle):
        return float(handle)


_flush_buffers: dict[str, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    """One 256 MB buffer per device and process, reused by every cell."""
    key = str(device)
    if key not in _flush_buffers:
        _flush_buffers[key] = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return _flush_buffers[key]


class CudaTimer(Timer):
    """CUDA events around each iteration, with the L2 flushed by a 256 MB write before it."""

    name = "cuda_events"

    def __init__(self, device: torch.device | None = None, l2_flush: bool = True):
        self.device = device or torch.device("cuda")
        self.l2_flush = l2_flush
        self._flush = _flush_buffer(self.device) if l2_flush else None

    def _sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def _start_one(self, fn):
        if self._flush is not None:
            self._flush.zero_()  # stream-ordered before the start event: never inside the timing
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end

    def _elapsed_ms(self, handle):
        start, end = handle
        end.synchronize()
        return float(start.elapsed_time(end))


class RankTimer(Timer):
    """One rank's timer in a context-parallel process group: the same protocol as a single device
    (this class's `time`), with every rank meeting at a barrier before each timed call, so each
    sample spans the same iteration on every rank (the iteration time is then the max over ranks),
    and the loop decisions agreed (`agree_max`: an all-reduce of the max)."""

    def __init__(self, inner: Timer, barrier: Callable[[], None], agree_max: Callable[[float], float]):
        self.inner, self.barrier, self.agree_max = inner, barrier, agree_max
        self.name, self.l2_flush = inner.name, inner.l2_flush

    def _sync(self) -> None:
        self.inner._sync()

    def _agree(self, value: float) -> float:
        return self.agree_max(value)

    def _start_one(self, fn):
        self.barrier()
        self.inner._sync()
        return self.inner._start_one(fn)

    def _elapsed_ms(self, handle):
        return self.inner._elapsed_ms(handle)


def timer_for(device: torch.device, l2_flush: bool = True) -> Timer:
    return CudaTimer(device, l2_flush) if device.type == "cuda" else CpuTimer()

"""Why two eager timers of one host-bound call disagree: the host's time per iteration beside the GPU's.

A short call (FA4's 1K backward: several kernels, each launched from Python) can take the host longer
to issue than the GPU takes to run. Timed with CUDA events after a 256 MB L2 flush, such a call's
sample is then the host's issue time less the flush's (the flush gives the host a head start), not
the kernels' time; when the host is a little faster than flush + kernels the queue fills and the
sample is the kernels' time. A loop whose host work per iteration lies near that boundary lands in
either regime, so two loops (longca's `CudaTimer`, `triton.testing.do_bench`) can differ by more than
their timers do.

For each case this prints and writes (JSON lines) per round, alternating the loops:
- `longca_loop_host_us`, `do_bench_loop_host_us`: the host's wall per iteration of each loop,
  issuing `--calls` iterations back to back (copies of the two timers' timed loops: longca's
  creates its two events per iteration, do_bench's before the loop); `longca_loop_ms`,
  `do_bench_loop_ms`: the median of the same iterations' events;
- `flush_ms`: the GPU time of the flush alone; `fn_host_us`: the host's issue time of the call
  alone (no flush, no events);
- `longca_ms` and `do_bench_ms`: the real timers (longca's under the given sweep's protocol);
- where the host's time goes when it swings, measured just before `fn_host_us`: `python_ns`, the
  wall per step of a fixed pure-Python loop (the CPU's own speed: frequency, other tenants; no
  torch), `launch_host_us`, the host's issue time of one tiny CUDA op (torch's dispatch and launch
  path, no kernel's Python), and `load1`, the host's one-minute load average. If `fn_host_us`
  follows `python_ns` across rounds the CPU is what swings; if it follows neither, the call's own
  Python (or its allocator) does.

    python benchmarks/eager_gap.py OUT.jsonl --spec specs/h200.yaml --sweep dense --kernel fa4 \
        --seqlen 1K --passes bwd,fwd --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import triton.testing
from timer_fidelity import fidelity_kernels, fidelity_passes, make_call, sweep_protocol

from longca.masks.registry import build_mask
from longca.measure.timer import CudaTimer, time_under
from longca.spec.load import parse_seqlen


def longca_loop(timer: CudaTimer, fn, before, n: int) -> tuple[float, float]:
    """(host µs per iteration, median ms): longca's timed loop (`Timer._batch`), its issuing timed."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    handles = []
    for _ in range(n):
        if before:
            before()
        handles.append(timer._start_one(fn))
    host = (time.perf_counter() - t0) / n * 1e6
    return host, statistics.median(timer._elapsed_ms(h) for h in handles)


def do_bench_loop(flush: torch.Tensor, fn, grads, n: int) -> tuple[float, float]:
    """(host µs per iteration, median ms): do_bench's timed loop (events made before it)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(n):
        if grads is not None:
            for x in grads:
                x.grad = None
        flush.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host, statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def fn_host_us(fn, before, n: int) -> float:
    """The host's issue time of the call alone, per call (no flush, no events)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        if before:
            before()
        fn()
    host = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return host


def python_ns(steps: int = 200_000) -> float:
    """Nanoseconds per step of a fixed pure-Python loop: the host CPU's speed, no torch, no CUDA."""
    t0 = time.perf_counter()
    acc = 0
    for i in range(steps):
        acc += i & 7
    return (time.perf_counter() - t0) / steps * 1e9


def flush_ms(flush: torch.Tensor, n: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        flush.zero_()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="JSON lines file to write")
    p.add_argument("--spec", required=True)
    p.add_argument("--sweep", required=True)
    p.add_argument("--kernel", default="fa4", help="one registered kernel")
    p.add_argument("--seqlen", default="1K")
    p.add_argument("--passes", default="bwd")
    p.add_argument("--masks", default="causal,full")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=1000, help="iterations of each copied loop per round")
    args = p.parse_args(argv)
    # every argument checked before the GPU is touched or OUT opened
    rep = sweep_protocol(args.spec, args.sweep)
    (kernel,) = fidelity_kernels(args.kernel)
    s = parse_seqlen(args.seqlen, "--seqlen")
    passes = fidelity_passes(args.passes)
    masks = tuple(m.strip() for m in args.masks.split(",") if m.strip())
    if not masks or set(masks) - {"full", "causal"}:
        raise SystemExit(f"--masks {args.masks!r}: allowed: full, causal (the fidelity table's masks)")
    device = torch.device("cuda")
    timer = CudaTimer(device, l2_flush=True)
    tiny = torch.zeros(16, device=device)
    with open(args.out, "w", encoding="utf-8") as out:
        for pass_ in passes:
            for mask in masks:
                for heads in ((64, 8), (32, 32)):
                    fn, before, grads = make_call(kernel, build_mask(mask, s), heads, pass_, device)
                    with torch.enable_grad() if grads else torch.no_grad():
                        for _ in range(20):  # compile and warm up outside every measurement
                            if before:
                                before()
                            fn()
                        for r in range(args.rounds):
                            row = {"kernel": kernel, "mask": mask, "heads": f"{heads[0]}:{heads[1]}", "seqlen": s}
                            row |= {"pass": pass_, "round": r, "device": torch.cuda.get_device_name(device)}
                            row["flush_ms"] = flush_ms(timer._flush)
                            row["python_ns"] = python_ns()
                            # torch's launch path alone: the same issue loop over a tiny in-place op
                            row["launch_host_us"] = fn_host_us(lambda: tiny.add_(1.0), None, args.calls)
                            row["load1"] = os.getloadavg()[0]
                            row["fn_host_us"] = fn_host_us(fn, before, args.calls)
                            row["longca_loop_host_us"], row["longca_loop_ms"] = longca_loop(
                                timer, fn, before, args.calls
                            )
                            row["do_bench_loop_host_us"], row["do_bench_loop_ms"] = do_bench_loop(
                                timer._flush, fn, grads, args.calls
                            )
                            timing = time_under(timer, fn, rep, before)
                            row["longca_ms"], row["longca_calls"] = timing.median_ms, timing.timed_iters
                            row["do_bench_ms"] = triton.testing.do_bench(fn, grad_to_none=grads, return_mode="median")
                            print(json.dumps(row), flush=True)
                            out.write(json.dumps(row) + "\n")
                            out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

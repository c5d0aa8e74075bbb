"""The device's measured matrix-product rate: the ceiling the report puts attention throughput against.

A square product of N x N matrices (2 N^3 FLOPs) in each 16-bit dtype (and e4m3 through
torch._scaled_mm where the device has fp8 tensor cores), timed by longca's CUDA timer (the same
timer and L2 flush as every cell) for several rounds; the record per dtype keeps every round's
median, the rounds' median and spread, the SM clock sampled during each round (as a cell's row
has it) and read after it, and the environment facts a row carries. `longca report --ceiling OUT.json` reads it.

    python benchmarks/matmul_ceiling.py OUT.json [--n 8192] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
from datetime import UTC, datetime

import torch

from longca.measure.clocks import ClockSampler
from longca.measure.env import environment, gpu_clock_state
from longca.measure.timer import CudaTimer


def _product(dtype: str, n: int, device: torch.device):
    if dtype == "float8_e4m3fn":
        a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # _scaled_mm takes B column-major
        one = torch.ones((), device=device)
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
    return lambda: a @ b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16", "float8_e4m3fn"])
    args = ap.parse_args()
    device = torch.device("cuda")
    env = environment("cuda")
    timer = CudaTimer(device)
    flops = 2.0 * args.n**3
    records = []
    for dtype in args.dtypes:
        if dtype == "float8_e4m3fn" and torch.cuda.get_device_capability(device) < (8, 9):
            continue
        fn = _product(dtype, args.n, device)
        rounds, clocks, window = [], [], []
        for _ in range(args.rounds):
            # the SM clock sampled while the calls run, as a cell's row has it (clock_window_mhz):
            # the ceiling at a row's clock is the rate per GHz of the round times that clock
            with ClockSampler(gpu_clock_state) as sampler:
                t = timer.time(fn, warmup=10, iters=200, min_iters=20, budget_s=1.0)
            rounds.append(t.median_ms)
            clocks.append(gpu_clock_state().get("clock_mhz"))
            window.append(sampler.summary()["clock_window_mhz"])
        tflops = [flops / (ms * 1e-3) / 1e12 for ms in rounds]
        rec = {
            "what": "matmul",
            "dtype": dtype,
            "n": args.n,
            "flops": flops,
            "round_median_ms": rounds,
            "round_tflops": tflops,
            "tflops": statistics.median(tflops),
            "tflops_min": min(tflops),
            "tflops_max": max(tflops),
            "clock_mhz": clocks,  # read after each round
            "clock_window_mhz": window,  # the median of the clock sampled during each round
            "timer": timer.name,
            "l2_flush": timer.l2_flush,
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            **{k: env.get(k) for k in ("device_name", "compute_capability", "driver", "cuda", "torch", "git_commit")},
        }
        records.append(rec)
        print(f"{dtype:>14} N={args.n}: {rec['tflops']:.0f} TFLOP/s (rounds {min(tflops):.0f}-{max(tflops):.0f})")
    with open(args.out, "w") as f:
        json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()

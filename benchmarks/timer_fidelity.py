"""Check longca's CUDA timer against a bare `triton.testing.do_bench` loop on the same calls.

For FA4 (when importable) and cuDNN SDPA, full and causal, at 32K tokens, GQA 64:8 and MHA
32:32, D=128, bf16, forward: longca's CudaTimer median vs do_bench's median, in one process.
Writes a JSON list to OUT and prints a table; the goal is agreement within 3%.

    python benchmarks/timer_fidelity.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import triton.testing

from longca.kernels.registry import get
from longca.masks.registry import build_mask
from longca.measure.flops import attention_flops
from longca.measure.timer import CudaTimer


def main(out: str) -> None:
    dev = torch.device("cuda")
    timer = CudaTimer(dev, l2_flush=True)
    rows = []
    for kname in ("sdpa_cudnn", "fa4"):
        try:
            kernel = get(kname)
        except KeyError:
            continue
        for mask_name in ("full", "causal"):
            for hq, hkv in ((64, 8), (32, 32)):
                s = 32768
                mask = build_mask(mask_name, s)
                try:
                    prep = kernel.prepare(mask, batch=1, heads_q=hq, heads_kv=hkv, head_dim=128,
                                          dtype=torch.bfloat16, device=dev, form=mask_name)
                except Exception as exc:  # noqa: BLE001
                    rows.append({"kernel": kname, "mask": mask_name, "error": str(exc)[:200]})
                    continue
                shape = (1, s, hq, 128) if prep.layout == "bshd" else (1, hq, s, 128)
                shape_kv = (1, s, hkv, 128) if prep.layout == "bshd" else (1, hkv, s, 128)
                q = torch.randn(shape, device=dev, dtype=torch.bfloat16)
                k = torch.randn(shape_kv, device=dev, dtype=torch.bfloat16)
                v = torch.randn(shape_kv, device=dev, dtype=torch.bfloat16)
                fn = lambda: prep.call(q, k, v)  # noqa: E731
                with torch.no_grad():
                    t = timer.time(fn, warmup=5, iters=20, min_iters=20, budget_s=60)
                    db = triton.testing.do_bench(fn, warmup=100, rep=500, return_mode="median")
                flops = attention_flops(mask.area, hq, 128, "fwd")
                rows.append({"kernel": kname, "mask": mask_name, "heads": f"{hq}:{hkv}", "seqlen": s,
                             "longca_median_ms": t.median_ms, "do_bench_median_ms": db,
                             "ratio": t.median_ms / db, "longca_tflops": flops / t.median_ms / 1e9,
                             "do_bench_tflops": flops / db / 1e9, "timed_iters": t.timed_iters})
    with open(out, "w") as fh:
        json.dump(rows, fh, indent=1)
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main(sys.argv[1])

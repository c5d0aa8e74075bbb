"""Build the FlexAttention BlockMask of every static mask at S = 524288 on the CPU.

Reports, per mask: slice build time, BlockMask build time (slices -> BlockMask, the part the
paper's FlexAttention runs could not do; wall and process CPU time), peak traced memory of the build (tracemalloc: numpy
and torch CPU allocations) and the process's peak RSS. Each mask runs in a fresh subprocess so
peaks do not mix. Goal: under 2 s and under 1 GB per mask.

    python benchmarks/masks_blockmask_512k.py [--seqlen 524288] [--block 128] [--out table.md]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, resource, sys, time, tracemalloc
import torch
torch.set_num_threads(int(sys.argv[4]))
from longca.masks.registry import build_mask
from longca.masks.flex import to_block_mask
name, seqlen, block = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tracemalloc.start()
t0 = time.perf_counter()
mask = build_mask(name, seqlen, seed=0)
t1 = time.perf_counter(); c1 = time.process_time()
bm = to_block_mask(mask, block)
t2 = time.perf_counter(); c2 = time.process_time()
_, peak = tracemalloc.get_traced_memory()
rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.stop()
del bm
w = time.perf_counter(); c = time.process_time()
bm = to_block_mask(mask, block)  # again, in the same process: memory the allocator already holds
warm_s, warm_cpu_s = time.perf_counter() - w, time.process_time() - c
partial = int(bm.kv_num_blocks.sum()); full = int(bm.full_kv_num_blocks.sum())
print(json.dumps(dict(mask=name, slices=len(mask.slices), build_s=t1 - t0, blockmask_s=t2 - t1, blockmask_cpu_s=c2 - c1, warm_s=warm_s, warm_cpu_s=warm_cpu_s,
                      traced_peak_mb=peak / 2**20, rss_peak_mb=rss_kb / 1024, partial_blocks=partial,
                      full_blocks=full, density=mask.density)))
"""


# The same process start, then only allocating and writing the BlockMask's four int32 index
# tensors (kv, full kv, q, full q: nq x nk each): the floor any BlockMask of this size pays.
BASELINE = r"""
import json, sys, time
import numpy as np, torch
torch.set_num_threads(int(sys.argv[3]))
n = -(-int(sys.argv[1]) // int(sys.argv[2]))
t = time.perf_counter(); c = time.process_time()
arrays = [np.empty((n, n), dtype=np.int32) for _ in range(4)]
for a in arrays:
    a.fill(1)
print(json.dumps(dict(wall_s=time.perf_counter() - t, cpu_s=time.process_time() - c, mb=4 * n * n * 4 / 2**20)))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=524288)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--masks", nargs="*", default=None, help="default: every static mask")
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    args = ap.parse_args()
    from longca.masks.registry import STATIC

    names = args.masks or list(STATIC)
    rows = []
    for name in names:
        res = subprocess.run(
            [sys.executable, "-c", CHILD, name, str(args.seqlen), str(args.block), str(args.threads)],
            capture_output=True,
            text=True,
        )
        if res.returncode:
            print(f"{name}: failed\n{res.stderr}", file=sys.stderr)
            rows.append(dict(mask=name, error=res.stderr.strip().splitlines()[-1]))
            continue
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), file=sys.stderr)
    res = subprocess.run(
        [sys.executable, "-c", BASELINE, str(args.seqlen), str(args.block), str(args.threads)],
        capture_output=True,
        text=True,
        check=True,
    )
    base = json.loads(res.stdout.strip().splitlines()[-1])
    lines = [
        f"S = {args.seqlen}, block {args.block}, torch threads {args.threads}; baseline: allocating and "
        f"writing the four index tensors alone ({base['mb']:.0f} MB) takes {base['wall_s']:.3f} s wall, "
        f"{base['cpu_s']:.3f} s CPU in a fresh process",
        "",
        "| mask | slices | mask build s | BlockMask s (wall) | (CPU) | again in-process s (wall) | (CPU) | traced peak MB | RSS peak MB | partial blocks | full blocks | density |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mask']} | error: {r['error']} |||||||| ")
            continue
        lines.append(
            f"| {r['mask']} | {r['slices']} | {r['build_s']:.3f} | {r['blockmask_s']:.3f} | {r['blockmask_cpu_s']:.3f} | "
            f"{r['warm_s']:.3f} | {r['warm_cpu_s']:.3f} | "
            f"{r['traced_peak_mb']:.0f} | {r['rss_peak_mb']:.0f} | {r['partial_blocks']} | "
            f"{r['full_blocks']} | {r['density']:.4f} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

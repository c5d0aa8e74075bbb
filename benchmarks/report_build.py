"""Benchmark: build a report from 20,000 synthetic result rows (the issue's goal: under 30 s on 2 cores).

The rows are the report tests' synthetic fixtures (tests/report/report_rows.py), scaled up: 12 masks,
5 kernels, 8 lengths, 2 head dims, sampled document masks, sparse, CP and linear rows. Prints the
row count, chart count, wall and CPU seconds (CPU includes the export worker processes; on a
shared, loaded box the CPU figure is the honest one) and the build's stage timings as JSON; record the result in docs/report.md.

    python benchmarks/report_build.py [--rows 20000] [--out /tmp/longca-bench-report] [--cold]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "report"))
from report_rows import synthetic_rows  # noqa: E402

from longca.masks.registry import STATIC as MASKS  # noqa: E402
from longca.report import build_report  # noqa: E402
from longca.report.export import bundle_cache  # noqa: E402
from longca.store.schema import to_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "longca-bench-report"))
    ap.add_argument("--cold", action="store_true", help="delete the cached Vega bundle first")
    args = ap.parse_args()
    rows = synthetic_rows(
        samples=4,
        seqlens=tuple(1024 * 2**i for i in range(8)),
        head_dims=(64, 128),
        masks=MASKS,
        kernels=("sdpa", "flex", "fa_fixture", "cudnn_fixture", "fa2_fixture"),
    )
    while len(rows) < args.rows:  # more sampled masks: same cells, more rows
        rows += [dict(r, mask_sample=r.get("mask_sample", 0) + 100) for r in rows[: args.rows - len(rows)]]
    rows = rows[: args.rows]
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    data = out.parent / (out.name + "-rows.parquet")
    pq.write_table(to_table(rows), data)
    if args.cold:
        bundle_cache().unlink(missing_ok=True)

    def cpu() -> float:  # this process and its finished children (the export workers)
        return sum(
            r.ru_utime + r.ru_stime
            for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
        )

    c0, t0 = cpu(), time.perf_counter()
    built = build_report([data], out, title="benchmark: synthetic rows")
    wall, cpu_s = time.perf_counter() - t0, cpu() - c0
    print(
        json.dumps(
            {
                "rows": len(rows),
                "charts": len(built.charts),
                "pages": len(built.pages),
                "cpus": os.cpu_count(),
                "load_avg_1min": os.getloadavg()[0],
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu_s, 2),
                "stages_cumulative_s": {k: round(v, 2) for k, v in built.timings.items()},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()

"""Project a sweep's efficiency and device time under another timing budget, from measured rows.

A projection, not a measurement (NOTES.md labels it so): each `ok` row's median call time is taken
as measured; under a budget B and a call cap N a row makes min(N, max(min_iters, B / call)) timed
calls. The overheads are parameters, set from the probes of calls 30-35: per row (warm-up, its
share of checks, row assembly), per timed call (the L2 flush), and fixed per sweep (compilation,
float32 references, first calls).

    python3 tools/sweep_projection.py --rows results/h200/all.parquet --sweep dense \
        --budgets 1 1.5 2 --caps 200 1000
"""

from __future__ import annotations

import argparse
import sys

import duckdb


def project(
    medians_ms: list[float],
    budget_s: float,
    cap: int,
    min_iters: int = 10,
    per_row_s: float = 0.15,
    per_call_ms: float = 0.05,
    fixed_s: float = 650.0,
) -> tuple[float, float]:
    """(timed share of the projected wall, projected wall in seconds)."""
    timed = wall = 0.0
    for m in medians_ms:
        n = min(cap, max(min_iters, int(budget_s * 1000.0 / m)))
        timed += n * m / 1000.0
        wall += n * m / 1000.0 + n * per_call_ms / 1000.0 + per_row_s
    wall += fixed_s
    return timed / wall, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--budgets", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    ap.add_argument("--caps", type=int, nargs="+", default=[200, 1000])
    ap.add_argument("--min-iters", type=int, default=10)
    ap.add_argument("--per-row-s", type=float, default=0.15)
    ap.add_argument("--per-call-ms", type=float, default=0.05)
    ap.add_argument("--fixed-s", type=float, default=650.0)
    a = ap.parse_args(argv)
    medians = [
        r[0]
        for r in duckdb.execute(
            "SELECT median_ms FROM read_parquet(?) WHERE sweep = ? AND status = 'ok' AND median_ms > 0",
            [a.rows, a.sweep],
        ).fetchall()
    ]
    if not medians:
        ap.error(f"no ok rows of sweep {a.sweep!r} in {a.rows}")
    print(
        f"{len(medians)} ok rows of {a.sweep}; per row {a.per_row_s} s, per call {a.per_call_ms} ms, "
        f"fixed {a.fixed_s} s"
    )
    for cap in a.caps:
        for b in a.budgets:
            share, wall = project(medians, b, cap, a.min_iters, a.per_row_s, a.per_call_ms, a.fixed_s)
            print(f"cap {cap:5d} calls, budget {b:4.2f} s: {share:.1%} timed, {wall / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())

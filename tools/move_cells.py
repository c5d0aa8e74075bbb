"""Move the cells a predicate picks out of a published aggregate into another table, so that the next
run measures them again (longca.store.aggregate.move_cells).

    python3 tools/move_cells.py results/h200/all.parquet results/h200/reruns.parquet \
        --where "graph_reason LIKE 'backward cells%' AND median_ms < 20"

Every row of a cell moves when any of its rows matches. The cells keep their digests: for a change
of the code that measures them, not of the spec (a spec change gives new digests by itself).
"""

from __future__ import annotations

import argparse
import sys

from longca.store.aggregate import move_cells


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", help="the aggregate to take the cells from (rewritten without them)")
    p.add_argument("dst", help="the table to append their rows to (created if absent)")
    p.add_argument("--where", required=True, help="a DuckDB predicate over the rows' columns")
    args = p.parse_args(argv)
    try:
        rows, cells = move_cells(args.src, args.dst, args.where)
    except ValueError as exc:
        print(f"move_cells: {exc}", file=sys.stderr)
        return 2
    print(f"moved {rows} rows of {cells} cells from {args.src} to {args.dst}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Move the cells a predicate picks out of a published aggregate into another table, so that the next
run measures them again (longca.store.aggregate.move_cells).

    python3 tools/move_cells.py specs/h200.yaml results/h200/all.parquet results/h200/reruns.parquet \
        --where "graph_reason LIKE 'backward cells%' AND median_ms < 20"

Every row of a cell moves when any of its rows matches. The cells keep their digests: for a change
of the code that measures them, not of the spec (a spec change gives new digests by itself). Only
the spec's current cells move: a matching cell of a superseded digest stays where it is, since no
run of the spec would measure it again (moving it would only drop its rows from the published set).
To put moved rows back whatever their digest (an undo), pass --any-digest:

    python3 tools/move_cells.py specs/h200.yaml results/h200/reruns.parquet results/h200/all.parquet \
        --where "cell_digest IN ('...')" --any-digest
"""

from __future__ import annotations

import argparse
import sys

from longca.store.aggregate import move_cells


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="the spec whose current cells may move (its YAML file; not read with --any-digest)")
    p.add_argument("src", help="the aggregate to take the cells from (rewritten without them)")
    p.add_argument("dst", help="the table to append their rows to (created if absent)")
    p.add_argument("--where", required=True, help="a DuckDB predicate over the rows' columns")
    p.add_argument("--any-digest", action="store_true", help="move superseded digests too (to put moved rows back)")
    args = p.parse_args(argv)
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    try:
        current = None if args.any_digest else {c.digest for c in expand(load_spec(args.spec))}
        moved = move_cells(args.src, args.dst, args.where, current)
    except (ValueError, FileNotFoundError) as exc:
        print(f"move_cells: {exc}", file=sys.stderr)
        return 2
    print(f"moved {moved.rows} rows of {moved.cells} cells from {args.src} to {args.dst}")
    if moved.not_current:
        print(f"left {moved.not_current} matching cells that are not cells of {args.spec} (superseded digests)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

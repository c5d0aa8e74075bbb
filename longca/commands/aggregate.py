"""`longca aggregate`: one Parquet table of every cell of a spec run."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("aggregate", help="union a spec's cell files into one Parquet table")
    p.add_argument("--spec", required=True)
    p.add_argument("--results", default="results")
    p.add_argument("--out", required=True)
    p.add_argument(
        "--present-only",
        action="store_true",
        help="aggregate the cells measured so far (a partial sweep), not every planned cell",
    )
    p.add_argument(
        "--keep",
        metavar="OLD_AGGREGATE",
        help="also keep this earlier aggregate's rows of cells the new table lacks (cells the spec "
        "no longer has, or measured under an earlier protocol: the report draws each cell's "
        "latest measurement and lists the rest as superseded)",
    )
    p.set_defaults(func=_aggregate)


def _aggregate(args: argparse.Namespace) -> int:
    from longca.spec.cells import expand
    from longca.spec.load import load_spec
    from longca.store.aggregate import aggregate

    spec = load_spec(args.spec)
    files = [c.output(args.results) for c in expand(spec)]
    if args.present_only:
        import os

        files = [f for f in files if os.path.exists(f)]
    n = aggregate(files, args.out)
    print(f"aggregated {len(files)} cells, {n} rows -> {args.out}")
    if args.keep:
        from longca.store.aggregate import keep_rows_outside

        kept = keep_rows_outside(args.out, args.keep)
        print(f"{args.out}: kept {kept} rows of cells outside the spec from {args.keep}")
    return 0

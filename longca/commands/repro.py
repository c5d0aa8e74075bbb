"""`longca repro CELL`: the command that measures a published cell again, and the commit it was
measured at (longca.report.repro)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repro", help="print the longca run command that re-measures a cell, and its commit")
    p.add_argument("cell", help="a cell id (as in rows, reports and `longca compare`), or its digest or a prefix of it")
    p.add_argument(
        "--rows",
        action="append",
        default=[],
        metavar="PARQUET",
        help="where to look for the cell (default: every results/*/all.parquet)",
    )
    p.set_defaults(func=_repro)


def _repro(args: argparse.Namespace) -> int:
    from longca.report.repro import find_rows, repro_command

    rows = find_rows(args.cell, args.rows)
    for row in rows:
        print(repro_command(row))
        print(
            f"# measured at commit {row.get('git_commit') or 'unknown'} on {row.get('device_name')}, "
            f"{row.get('timestamp')}"
        )
    return 0

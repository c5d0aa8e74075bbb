"""`longca unpack`: restore cell files from an aggregate table, so a run only adds missing cells."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("unpack", help="restore cell files from an aggregate Parquet table")
    p.add_argument("aggregate", nargs="+", help="aggregate table(s), e.g. results/h200/all.parquet")
    p.add_argument("--results", default="results")
    p.set_defaults(func=_unpack)


def _unpack(args: argparse.Namespace) -> int:
    from longca.store.aggregate import unpack

    for agg in args.aggregate:
        written, kept = unpack(agg, args.results)
        print(f"{agg}: {written} cell files restored, {kept} already present")
    return 0

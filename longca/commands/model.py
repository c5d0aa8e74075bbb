"""`longca model cp`: modelled CP rows of a spec on a described cluster (longca.model.cp), written
to their own table (`source = model`), never among measured rows."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    from longca.spec.select import ONLY_HELP

    p = sub.add_parser("model", help="modelled results: CP cells of a spec on a described cluster")
    kinds = p.add_subparsers(dest="model", required=True)
    cp = kinds.add_parser("cp", help="each CP cell's per-rank time on a cluster, from measured single-GPU rates")
    cp.add_argument("--spec", required=True, help="spec YAML whose CP cells to model (e.g. specs/cp-scale.yaml)")
    cp.add_argument("--cluster", required=True, help="cluster YAML (e.g. specs/clusters/h200-ib.yaml)")
    cp.add_argument(
        "--rates",
        action="append",
        required=True,
        metavar="PARQUET",
        help="measured rows whose single-GPU TFLOP/s time each step (repeatable), e.g. results/h200/all.parquet",
    )
    cp.add_argument(
        "--out", required=True, help="model table to write (Parquet), e.g. results/cp-scale/model-h200-ib.parquet"
    )
    cp.add_argument("--sweep", action="append", help="only these sweeps (repeatable)")
    cp.add_argument("--only", action="append", default=[], metavar="KEY=VALUE", help=ONLY_HELP)
    cp.add_argument("--jobs", type=int, default=1, help="cells modelled in parallel processes (default 1)")
    cp.add_argument(
        "--draws",
        type=int,
        default=1,
        help="mask draws modelled per cell of a sampled mask (documents), at most the cell's own; "
        "the row holds the median draw (default 1)",
    )
    cp.set_defaults(func=_model_cp)

    v = kinds.add_parser(
        "validate", help="the CP model against measured CP rows, rank-local timings and a peer's ranking"
    )
    v.add_argument("--cluster", required=True, help="cluster YAML of the machine the measured rows ran on")
    v.add_argument("--rates", action="append", required=True, metavar="PARQUET", help="measured single-GPU rows")
    v.add_argument("--cp-rows", metavar="PARQUET", help="measured CP rows (e.g. results/h200-cp/all.parquet)")
    v.add_argument("--cp-spec", metavar="YAML", help="the spec of --cp-rows (only its current cells are compared)")
    v.add_argument("--cp-local", action="append", default=[], metavar="JSON", help="benchmarks/cp_rank_local.py output")
    v.add_argument("--peers", metavar="CSV", help="published CP figures (e.g. longca/data/magiattention_cp.csv)")
    v.add_argument("--model", metavar="PARQUET", help="a model table at the peers' setting (for the ranking)")
    v.add_argument("--out", required=True, help="validation table to write (CSV)")
    v.set_defaults(func=_model_validate)


class _Inline:
    """A pool of one: map in this process (no pickling, exceptions with their traceback)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def map(self, fn, *iterables):
        return map(fn, *iterables)


def _model_cp(args: argparse.Namespace) -> int:
    import time
    from concurrent.futures import ProcessPoolExecutor
    from itertools import repeat

    from longca.model.cluster import load_cluster
    from longca.model.cp import model_row, model_table
    from longca.model.rates import load_rates
    from longca.spec.cells import expand
    from longca.spec.load import load_spec
    from longca.spec.select import check_selection, selector
    from longca.store.write import PUBLISHED_ZSTD_LEVEL, write_table

    cluster = load_cluster(args.cluster)  # errors name the field before anything is computed
    spec = load_spec(args.spec)
    cells = expand(spec)
    check_selection(spec.name, cells, args.sweep, args.only)
    chosen = [c for c in cells if c.cp_mechanism and selector(args.only, args.sweep)(c)]
    if not chosen:
        raise ValueError(f"spec {spec.name!r}: no CP cell in the selection (a CP sweep has a `cp:` block)")
    rates = load_rates(args.rates, cluster.gpu)
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: allowed: a positive number of processes")
    if args.draws < 1:
        raise ValueError(f"--draws {args.draws}: allowed: a positive number of mask draws")
    from longca.measure.env import git_commit

    commit = git_commit()  # once: a commit made while the cells are modelled must not split the table
    rows, t0 = [], time.monotonic()
    with ProcessPoolExecutor(args.jobs) if args.jobs > 1 else _Inline() as pool:
        for i, row in enumerate(
            pool.map(model_row, chosen, repeat(cluster), repeat(rates), repeat(args.draws), repeat(commit)), 1
        ):
            rows.append(row)
            shown = f"{row['tflops']:.0f} TFLOP/s per GPU" if row["status"] == "ok" else f"unsupported: {row['reason']}"
            print(f"[{i}/{len(chosen)}] {chosen[i - 1].id}: {shown}", file=sys.stderr)
    write_table(args.out, model_table(rows), level=PUBLISHED_ZSTD_LEVEL)
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"modelled {len(rows)} cells ({ok} ok) on {cluster.name} in {time.monotonic() - t0:.0f} s -> {args.out}")
    return 0


def _model_validate(args: argparse.Namespace) -> int:
    import polars as pl

    from longca.model import validate
    from longca.model.cluster import load_cluster
    from longca.model.rates import load_rates

    cluster = load_cluster(args.cluster)
    if bool(args.cp_rows) != bool(args.cp_spec):
        raise ValueError(
            "--cp-rows and --cp-spec go together: the measured CP rows and the spec they were measured for"
        )
    if bool(args.peers) != bool(args.model):
        raise ValueError("--peers and --model go together: the published figures and a model table at their setting")
    rates = load_rates(args.rates, cluster.gpu)
    rows = []
    if args.cp_rows:
        rows += validate.against_measured(args.cp_rows, args.cp_spec, cluster, rates)
    rows += validate.against_rank_local(args.cp_local, cluster, rates)
    if args.peers:
        rows += validate.against_ranking(args.peers, pl.read_parquet(args.model))
    table = validate.validation_table(rows)
    if table.is_empty():
        raise ValueError("nothing to validate: give --cp-rows/--cp-spec, --cp-local or --peers/--model")
    table.write_csv(args.out, float_precision=4)
    for (check,), part in table.group_by(["check"], maintain_order=True):
        err = part.get_column("error").abs()
        print(
            f"{check}: {part.height} comparisons, |error| median {err.median():.1%}, max {err.max():.1%}, "
            f"within 15%: {(err <= 0.15).sum()} of {part.height}"
        )
    print(f"-> {args.out}")
    return 0

"""`longca run`: measure cells of a spec (the Snakemake jobs call this with their output files)."""

from __future__ import annotations

import argparse
from pathlib import Path

from longca.spec.select import ONLY_HELP


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run cells of a spec; with no outputs, every missing cell")
    p.add_argument("--spec", required=True, help="spec YAML file")
    p.add_argument(
        "--results",
        default="results",
        help="results folder (default: results); {card} in it becomes the set of the card the run is on, "
        "e.g. results/{card} -> results/h100 (longca.measure.env.card_set)",
    )
    p.add_argument(
        "--launcher",
        default="auto",
        choices=["auto", "torchrun", "srun"],
        help="how context-parallel cells start their processes",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="I/N",
        help="run only every N-th pending cell starting at I (one process per GPU on one host)",
    )
    p.add_argument("--sweep", action="append", default=None, help="only these sweeps (repeatable)")
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE", help=ONLY_HELP)
    p.add_argument(
        "--retry",
        action="append",
        default=[],
        choices=["error", "timeout", "oom", "incorrect", "unsupported"],
        help="also rerun cells whose recorded status is this (repeatable), e.g. after a fix, or `unsupported` "
        "after a kernel's capabilities grew (`longca plan` counts such cells)",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=None,
        metavar="N",
        help="run only N cells drawn at random (seeded by --sample-seed) from the selected cells that would "
        "touch a device: a re-run check of a published set, into another --results folder",
    )
    p.add_argument("--sample-seed", type=int, default=0, help="seed of --sample's draw (default 0)")
    p.add_argument(
        "--sample-from",
        metavar="PARQUET",
        default=None,
        help="with --sample: draw only among the cells that have ok rows of their current digest in this table "
        "(a published aggregate, or any Parquet with a cell_digest column): a re-run check of what it measured",
    )
    p.add_argument(
        "--time-left",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the run must be done within SECONDS (a device call's limit): with --estimates, a single-device cell "
        "whose projection does not fit in the time left is left for a later run (longca/run/time_left.py)",
    )
    p.add_argument(
        "--estimates",
        metavar="PARQUET",
        default=None,
        help="with --time-left: each cell's projected seconds (cell_digest, projected_s), as "
        "tools/sweep_projection.py --spec SPEC --cells-out writes them",
    )
    p.add_argument("outputs", nargs="*", help="cell output files to produce (as planned by the Snakefile)")
    p.add_argument(
        "--outputs-from",
        metavar="FILE",
        default=None,
        help="read the cell output files from FILE, one a line (the Snakefile's job lists: a job's "
        "command line stays short however many cells it has)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from longca.run.chunk import run_chunk
    from longca.run.plan import plan_jobs
    from longca.spec.load import load_spec
    from longca.spec.select import check_selection, selector

    time_left = _time_left(args.time_left, args.estimates)
    spec = load_spec(args.spec)  # once per process: every chunk below runs from this spec and its cells
    if "{card}" in args.results:
        from longca.measure.env import this_card_set

        args.results = args.results.replace("{card}", this_card_set(spec.device))
    if args.outputs_from:
        args.outputs += [line for line in Path(args.outputs_from).read_text().splitlines() if line.strip()]
    if args.outputs:
        return run_chunk(spec, args.outputs, args.results, args.launcher, time_left=time_left)
    cells, jobs = plan_jobs(spec, args.results, retry=frozenset(args.retry))
    check_selection(spec.name, cells, args.sweep, args.only)
    if args.shard:
        try:
            i, n = (int(x) for x in args.shard.split("/"))
            assert 0 <= i < n
        except (ValueError, AssertionError):
            raise ValueError(f"--shard {args.shard!r}: expected I/N with 0 <= I < N, e.g. 0/2") from None
    # Planned-unsupported chunks first: they touch no device and take no time, so a run stopped by a
    # time limit has recorded every cell the capabilities rule out (Snakemake runs them as separate jobs).
    jobs = sorted(jobs, key=lambda j: j.kind != "planned")
    keep = selector(args.only, args.sweep)
    if args.sample_from is not None and args.sample is None:
        raise ValueError("--sample-from: allowed only with --sample N (it narrows what --sample draws from)")
    if args.sample is not None:
        among = _digests(args.sample_from) if args.sample_from is not None else None
        keep = _sampled(jobs, keep, args.sample, args.sample_seed, among, args.sample_from)
    for job in jobs:
        pairs = [(c, o) for c, o in zip(job.cells, job.outputs) if keep(c)]
        if args.shard:
            # Whole configurations per shard: the passes and samples of one kernel x mask x shape
            # share one correctness check and one compilation in their process.
            pairs = [(c, o) for c, o in pairs if _config_index(c) % n == i]
        outputs = [o for _, o in pairs]
        if outputs:
            run_chunk(spec, outputs, args.results, args.launcher, cells=cells, time_left=time_left)
    return 0


def _time_left(seconds: float | None, estimates: str | None):
    """The run's TimeLeft from --time-left and --estimates (both or neither), counted from now."""
    import math

    from longca.run.time_left import TimeLeft, load_estimates

    if seconds is None and estimates is None:
        return None
    if seconds is None or estimates is None:
        given, missing = ("--time-left", "--estimates") if estimates is None else ("--estimates", "--time-left")
        raise ValueError(f"{given}: allowed only with {missing} (which cells fit needs both)")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"--time-left {seconds:g}: allowed: a positive number of seconds")
    return TimeLeft.starting_now(seconds, load_estimates(estimates))


def _config_index(cell) -> int:
    """A stable number for the cell's configuration: its partition without the pass."""
    import hashlib

    key = "|".join(f"{k}={v}" for k, v in cell.partition if k != "pass")
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


def _digests(path: str) -> frozenset[str]:
    """The cell digests a Parquet table holds measured rows of (`--sample-from`): its `ok` rows where
    it has a status column (a re-run check compares medians), else every row's."""
    from longca.store.read import digest_statuses

    try:
        digests, statuses = digest_statuses(path)
    except FileNotFoundError:
        raise ValueError(f"--sample-from {path!r}: no such file") from None
    except (KeyError, ValueError, OSError) as exc:  # not Parquet, or no cell_digest column
        raise ValueError(
            f"--sample-from {path!r}: allowed: a Parquet table with a cell_digest column ({exc})"
        ) from None
    if statuses is None:
        return frozenset(d for d in digests if d)
    return frozenset(d for d, status in zip(digests, statuses) if d and status == "ok")


def _sampled(jobs, keep, n: int, seed: int, among: frozenset[str] | None = None, source: str | None = None):
    """`keep` narrowed to n cells drawn at random (seeded) from the selected cells that would touch a
    device (planned-unsupported ones are left out: they re-run nothing); with `among`, only from the
    cells whose current digest is in it (those `source` measured under the spec's present protocol)."""
    import random

    if n < 1:
        raise ValueError(f"--sample {n}: allowed: a positive number of cells")
    pool = sorted(
        c.digest
        for j in jobs
        if j.kind != "planned"
        for c in j.cells
        if keep(c) and (among is None or c.digest in among)
    )
    if not pool and among is not None:
        raise ValueError(
            f"--sample-from {source!r}: no selected cell that would touch a device has rows of its current digest "
            "there (measured under another protocol, or not selected)"
        )
    chosen = set(random.Random(seed).sample(pool, min(n, len(pool))))
    return lambda cell: keep(cell) and cell.digest in chosen

"""`longca run`: measure cells of a spec (the Snakemake jobs call this with their output files)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run cells of a spec; with no outputs, every missing cell")
    p.add_argument("--spec", required=True, help="spec YAML file")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--launcher", default="auto", choices=["auto", "torchrun", "srun"],
                   help="how context-parallel cells start their processes")
    p.add_argument("outputs", nargs="*", help="cell output files to produce (as planned by the Snakefile)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from longca.run.chunk import run_chunk
    from longca.run.plan import plan_jobs
    from longca.spec.load import load_spec

    if args.outputs:
        return run_chunk(args.spec, args.outputs, args.results, args.launcher)
    _, jobs = plan_jobs(load_spec(args.spec), args.results)
    for job in jobs:
        run_chunk(args.spec, job.outputs, args.results, args.launcher)
    return 0

"""`longca run`: measure cells of a spec (the Snakemake jobs call this with their output files)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run cells of a spec; with no outputs, every missing cell")
    p.add_argument("--spec", required=True, help="spec YAML file")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument("--launcher", default="auto", choices=["auto", "torchrun", "srun"],
                   help="how context-parallel cells start their processes")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="run only every N-th pending cell starting at I (one process per GPU on one host)")
    p.add_argument("--sweep", action="append", default=None, help="only these sweeps (repeatable)")
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE",
                   help="only cells with this value (repeatable; repeated keys are alternatives), keys: "
                        "kernel, mask, seqlen, heads, head_dim, dtype, pass, batch, cp_mechanism, world_size")
    p.add_argument("--retry", action="append", default=[], choices=["error", "timeout", "oom", "incorrect"],
                   help="also rerun cells whose recorded status is this (repeatable), e.g. after a fix")
    p.add_argument("outputs", nargs="*", help="cell output files to produce (as planned by the Snakefile)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from longca.run.chunk import run_chunk
    from longca.run.plan import plan_jobs
    from longca.spec.load import load_spec

    if args.outputs:
        return run_chunk(args.spec, args.outputs, args.results, args.launcher)
    _, jobs = plan_jobs(load_spec(args.spec), args.results, retry=frozenset(args.retry))
    if args.shard:
        try:
            i, n = (int(x) for x in args.shard.split("/"))
            assert 0 <= i < n
        except (ValueError, AssertionError):
            raise ValueError(f"--shard {args.shard!r}: expected I/N with 0 <= I < N, e.g. 0/2") from None
    if args.sweep:
        jobs = [j for j in jobs if j.cells[0].sweep in args.sweep]
    keep = _filter(args.only)
    for job in jobs:
        pairs = [(c, o) for c, o in zip(job.cells, job.outputs) if keep(c)]
        if args.shard:
            # Whole configurations per shard: the passes and samples of one kernel x mask x shape
            # share one correctness check and one compilation in their process.
            pairs = [(c, o) for c, o in pairs if _config_index(c) % n == i]
        outputs = [o for _, o in pairs]
        if outputs:
            run_chunk(args.spec, outputs, args.results, args.launcher)
    return 0


def _config_index(cell) -> int:
    """A stable number for the cell's configuration: its partition without the pass."""
    import hashlib

    key = "|".join(f"{k}={v}" for k, v in cell.partition if k != "pass")
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


def _filter(only: list[str]):
    from longca.spec.load import DTYPE_ALIASES, parse_seqlen

    wanted: dict[str, set[str]] = {}
    for item in only:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--only {item!r}: expected KEY=VALUE")
        if key == "seqlen":
            value = str(parse_seqlen(value, "--only seqlen"))
        elif key == "dtype":
            value = DTYPE_ALIASES.get(value, value)
        wanted.setdefault(key, set()).add(value)

    def value_of(cell, key):
        if key == "heads":
            return f"{cell.heads_q}:{cell.heads_kv}"
        attr = {"pass": "pass_"}.get(key, key)
        if not hasattr(cell, attr):
            raise ValueError(f"--only: unknown key {key!r}; allowed: kernel, mask, seqlen, heads, head_dim, dtype, "
                             "pass, batch, cp_mechanism, world_size")
        return str(getattr(cell, attr))

    return lambda cell: all(value_of(cell, k) in vals for k, vals in wanted.items())

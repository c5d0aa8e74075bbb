"""`longca plan`: validate a spec and show its cells and the jobs still to run (no device touched)."""

from __future__ import annotations

import argparse
import collections
import json

from longca.spec.select import ONLY_HELP


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="validate a spec and list its cells and pending jobs")
    p.add_argument("spec", help="spec YAML file")
    p.add_argument("--results", default="results", help="results folder (default: results)")
    p.add_argument(
        "--rows",
        action="append",
        default=[],
        metavar="PARQUET",
        help="also count as done the cells with rows in this aggregate (repeatable), "
        "e.g. results copied from another machine and not unpacked",
    )
    p.add_argument("--sweep", action="append", default=None, help="only these sweeps (repeatable)")
    p.add_argument("--only", action="append", default=[], metavar="KEY=VALUE", help=ONLY_HELP)
    p.add_argument("--json", action="store_true", help="print every selected cell as JSON lines")
    p.add_argument(
        "--rows-out",
        metavar="PARQUET",
        help="write the rows of the selected cells that the --rows aggregates hold to this file (a cell "
        "several hold: the last one's rows): what a call on a size-capped GPU host carries so that it "
        "skips them (docs/gpu-host.md)",
    )
    p.add_argument(
        "--superseded-out",
        metavar="PARQUET",
        help="write the rows of the --rows aggregates whose digest no cell of the spec has (measured "
        "under an earlier version of it, or cells it dropped) to this file: with --rows-out and no "
        "selection, a published aggregate splits into its current set and the downloadable rest",
    )
    p.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from longca.run.plan import plan_jobs
    from longca.run.serving import planned_unsupported
    from longca.spec.load import load_spec
    from longca.spec.select import check_selection, selector
    from longca.store.draws import kept_draws

    spec = load_spec(args.spec)
    cells, jobs = plan_jobs(spec, args.results)
    check_selection(spec.name, cells, args.sweep, args.only)
    chosen = list(filter(selector(args.only, args.sweep), cells))
    if args.json:
        for c in chosen:
            print(json.dumps({"id": c.id, "output": c.output(args.results), "unsupported": planned_unsupported(c)}))
        return 0
    wanted = {c.digest for c in chosen}
    if args.rows_out:
        n = _write_rows_of(args.rows, wanted, args.rows_out)
        print(f"{args.rows_out}: {n} rows of the selected cells from {', '.join(args.rows) or 'no --rows'}")
    if args.superseded_out:
        n = _write_rows_outside(args.rows, {c.digest for c in cells}, args.superseded_out)
        sources = ", ".join(args.rows) or "no --rows"
        print(f"{args.superseded_out}: {n} rows of digests the spec no longer has from {sources}")
    recorded, refused = _digests(args.rows)
    kind_of = {c.digest: j.kind for j in jobs for c in j.cells if c.digest in wanted and c.digest not in recorded}
    pending_jobs = [j for j in jobs if any(c.digest in kind_of for c in j.cells)]
    scope = "" if len(chosen) == len(cells) else f" ({len(chosen)} selected)"
    print(
        f"spec {spec.name}: {len(cells)} cells in {len(spec.sweeps)} sweep(s){scope}; {len(kind_of)} to run "
        f"in {len(pending_jobs)} job(s) {dict(collections.Counter(j.kind for j in pending_jobs))}"
    )
    print(_table(chosen, kind_of))
    kept = {d: n for d, n in kept_draws(args.results, spec.name).items() if d in kind_of}
    if kept:
        print(
            f"{len(kept)} of the cells to run have {sum(kept.values())} draws kept from a run stopped inside "
            "them: they measure only their other draws"
        )
    stale = _refused_but_allowed(chosen, kind_of, refused, args.results)
    if stale:
        print(
            f"{sum(stale.values())} done cells are recorded `unsupported` although the kernels' capabilities do "
            f"not rule them out now (a run refused them, or the capabilities grew since): "
            + ", ".join(f"{k} {n}" for k, n in sorted(stale.items()))
            + "; `longca run --retry unsupported` with a selection measures them again"
        )
    return 0


def _digests(paths: list[str]) -> tuple[set[str], set[str]]:
    """The cell digests with rows in these aggregates, and those of them recorded `unsupported`."""
    from longca.store.read import digest_statuses

    done: set[str] = set()
    refused: set[str] = set()
    for p in paths:
        digests, statuses = digest_statuses(p)
        done.update(digests)
        refused.update(d for d, s in zip(digests, statuses or []) if s == "unsupported")
    return done, refused


def _write_rows_of(paths: list[str], digests: set[str], out: str) -> int:
    """Write the rows of these aggregates whose cell digest is in `digests` to `out` (the published
    compression); returns how many. Only current digests pass, so no superseded row travels.

    A cell's rows come from one aggregate only, the last given that holds it (a later call's
    aggregate holds the cells an earlier one carried): rows of one cell from two aggregates would
    be unpacked into one cell file twice over and aggregated as duplicates."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    parts, left = [], set(digests)
    for table in map(pq.read_table, reversed(paths)):
        part = table.filter(pc.is_in(table["cell_digest"], value_set=pa.array(sorted(left), type=pa.string())))
        left -= set(part.column("cell_digest").to_pylist())
        parts.insert(0, part)
    return _write_parts(parts, out)


def _write_rows_outside(paths: list[str], digests: set[str], out: str) -> int:
    """Write the rows of these aggregates whose cell digest is not in `digests` (or is missing) to
    `out` (the published compression); returns how many."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    current = pa.array(sorted(digests), type=pa.string())
    parts = [
        t.filter(pc.invert(pc.fill_null(pc.is_in(t["cell_digest"], value_set=current), False)))
        for t in map(pq.read_table, paths)
    ]
    return _write_parts(parts, out)


def _write_parts(parts: list, out: str) -> int:
    """The tables as one file at the published compression (an empty one when there are none);
    returns its row count."""
    import pyarrow as pa

    from longca.store.write import PUBLISHED_ZSTD_LEVEL, write_table

    table = (
        pa.concat_tables(parts, promote_options="permissive")
        if parts
        else pa.table({"cell_digest": pa.array([], pa.string())})
    )
    write_table(out, table, level=PUBLISHED_ZSTD_LEVEL)
    return table.num_rows


def _refused_but_allowed(cells: list, kind_of: dict[str, str], refused: set[str], results: str) -> dict[str, int]:
    """Per kernel, the done cells recorded `unsupported` whose declared capabilities accept them now.
    A recorded cell is never planned again by itself, so a kernel whose capabilities grew (a new
    mask form, a dtype) keeps its old refusals until asked to retry them."""
    from pathlib import Path

    from longca.run.plan import recorded_status
    from longca.run.serving import planned_unsupported

    out: dict[str, int] = {}
    for c in cells:
        if c.digest in kind_of or planned_unsupported(c) is not None:
            continue
        path = Path(c.output(results))
        if c.digest in refused or (path.exists() and recorded_status(path) == "unsupported"):
            out[c.kernel] = out.get(c.kernel, 0) + 1
    return out


def _table(cells: list, kind_of: dict[str, str]) -> str:
    """Per sweep, kernel and CP mechanism: cells, done, to run, and how many of those the
    capabilities rule out (recorded `unsupported` without a device)."""
    counts: dict[tuple[str, str, str], list[int]] = {}
    for c in cells:
        n = counts.setdefault((c.sweep, c.kernel, c.cp_mechanism or "-"), [0, 0, 0, 0])
        n[0] += 1
        if c.digest in kind_of:
            n[2] += 1
            n[3] += kind_of[c.digest] == "planned"
        else:
            n[1] += 1
    head = ("sweep", "kernel", "cp", "cells", "done", "to run", "of which planned unsupported")
    rows = [head] + [(*key, *map(str, n)) for key, n in counts.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join(
        "  ".join(v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in rows
    )

"""`longca plan`: validate a spec and show its cells and the jobs still to run (no device touched)."""

from __future__ import annotations

import argparse
import collections
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="validate a spec and list its cells and pending jobs")
    p.add_argument("spec", help="spec YAML file")
    p.add_argument("--results", default="results")
    p.add_argument("--json", action="store_true", help="print every cell as JSON lines")
    p.set_defaults(func=_plan)


def _plan(args: argparse.Namespace) -> int:
    from longca.run.cell import planned_unsupported
    from longca.run.plan import plan_jobs
    from longca.spec.load import load_spec

    spec = load_spec(args.spec)
    cells, jobs = plan_jobs(spec, args.results)
    if args.json:
        for c in cells:
            print(json.dumps({"id": c.id, "output": c.output(args.results),
                              "unsupported": planned_unsupported(c) if c.cp_mechanism is None else None}))
        return 0
    kinds = collections.Counter(j.kind for j in jobs)
    pending = sum(len(j.cells) for j in jobs)
    print(f"spec {spec.name}: {len(cells)} cells in {len(spec.sweeps)} sweep(s); {pending} to run in {len(jobs)} "
          f"job(s) {dict(kinds)}")
    return 0

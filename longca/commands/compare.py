"""`longca compare BASE NEW`: A/B verdicts between two result sets (longca.report.compare)."""

from __future__ import annotations

import argparse

from longca.vocab import Verdict


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="which cells got faster or slower between two result sets, beyond noise",
        description="Match the rows of two result sets (aggregates or results folders) by their "
        "axes and give each cell a verdict: " + ", ".join(Verdict) + ".",
    )
    p.add_argument("base", help="the reference set: an aggregate (all.parquet) or a results folder")
    p.add_argument("new", help="the set to judge against it")
    p.add_argument("--threshold", type=float, default=0.03, help="smallest change that counts (default 0.03: 3%%)")
    p.add_argument(
        "--reruns",
        action="append",
        default=[],
        metavar="FILE",
        help="rows of earlier runs of the base's cells (repeatable, e.g. results/h200/reruns.parquet): count the "
        "new medians inside each base row's re-run interval, its 95%% interval widened to the move between runs",
    )
    p.add_argument("--json", metavar="FILE", help="write one record per cell and the summary here")
    p.add_argument("--html", metavar="DIR", help="write a page (DIR/index.html) sorted by effect, filterable")
    p.add_argument(
        "--fail-on",
        action="append",
        default=[],
        choices=["slower", "noisy", "status changed"],
        help="exit 1 when any cell has this verdict (repeatable): a CI gate for kernel work",
    )
    p.set_defaults(func=_compare)


def _compare(args: argparse.Namespace) -> int:
    from longca.report.compare import compare, summary_text, write_html, write_json

    result = compare(args.base, args.new, args.threshold, args.reruns)
    print(summary_text(result))
    if args.json:
        write_json(result, args.json)
    if args.html:
        print(f"wrote {write_html(result, args.html)}")
    failing = {v: n for v, n in result.summary["verdicts"].items() if v in args.fail_on}
    if failing:
        print("failing: " + ", ".join(f"{n} {v}" for v, n in failing.items()))
        return 1
    return 0

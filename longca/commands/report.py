"""`longca report`: build the static report site of one spec run from its aggregated Parquet rows."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="build the static HTML report (charts, tables, downloads) from result rows",
        description="Build a static site (index.html and pages, no server, no network) from result Parquet files.",
    )
    p.add_argument(
        "--data",
        action="append",
        required=True,
        metavar="PARQUET",
        help="result rows: a Parquet file or a directory of them (repeat for more)",
    )
    p.add_argument(
        "--probe",
        action="append",
        default=[],
        metavar="PARQUET",
        help="rows of protocol probes: shown only in the Status page's measurement-time tables, "
        "never drawn (repeatable)",
    )
    p.add_argument(
        "--fidelity",
        action="append",
        default=[],
        metavar="JSON",
        help="timer fidelity checks (benchmarks/timer_fidelity.py's output), tabled on the Status page (repeatable)",
    )
    p.add_argument(
        "--cp-local",
        action="append",
        default=[],
        metavar="JSON",
        help="one CP rank's local work timed on one GPU (benchmarks/cp_rank_local.py's output), tabled "
        "on the CP page (repeatable)",
    )
    p.add_argument(
        "--ceiling",
        action="append",
        default=[],
        metavar="JSON",
        help="measured matrix-product rates (benchmarks/matmul_ceiling.py's output): the choose page "
        "gives each best kernel's share of it (repeatable)",
    )
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="PARQUET",
        help="modelled CP rows (`longca model cp` tables), drawn on their own page (repeatable)",
    )
    p.add_argument(
        "--model-validation",
        metavar="CSV",
        help="the CP model's validation table (`longca model validate`), on the modelled page",
    )
    p.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="TEXT=PATH",
        help="a page beside the report to link from its Environment page (repeatable), e.g. a "
        "`longca compare --html` page written under the report folder",
    )
    p.add_argument(
        "--reruns",
        action="append",
        default=[],
        metavar="PARQUET",
        help="earlier runs of cells of --data (never drawn): how far a median moves between runs, which the "
        "choose page adds to the intervals of kernels measured in different runs (repeatable)",
    )
    p.add_argument("--spec", metavar="SPEC.yaml", help="the spec that produced the rows, shown on the provenance page")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory, e.g. reports/<spec>/")
    p.add_argument("--title", help="site title (default: 'longca: <spec>')")
    p.add_argument("--peers", metavar="CSV", help="published figures to overlay (default: longca's own peers.csv)")
    p.add_argument("--no-png", action="store_true", help="skip PNG exports (SVG, spec and CSV are still written)")
    p.add_argument(
        "--no-exports",
        action="store_true",
        help="write no charts/ folder (SVG, PNG, spec and CSV per chart): the pages offer the same "
        "downloads from the drawn charts; for published reports, whose size matters",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from longca.report import build_report  # heavy imports (altair, vl-convert) only when used

    built = build_report(
        args.data,
        args.out,
        spec=args.spec,
        title=args.title,
        png=not args.no_png,
        static_exports=not args.no_exports,
        links=[_link(text) for text in args.link],
        peers_path=args.peers,
        probe=args.probe,
        fidelity_checks=args.fidelity,
        cp_local_runs=args.cp_local,
        ceiling_files=args.ceiling,
        model_tables=args.model,
        model_validation=args.model_validation,
        reruns=args.reruns,
    )
    print(
        f"wrote {len(built.pages)} pages and {len(built.charts)} charts to {built.out} "
        f"in {built.timings['total']:.1f} s; open {built.out / 'index.html'}"
    )
    return 0


def _link(text: str) -> tuple[str, str]:
    label, sep, path = text.rpartition("=")
    if not sep or not label or not path:
        raise ValueError(f"--link {text!r}: expected TEXT=PATH (PATH relative to the report folder)")
    return path, label

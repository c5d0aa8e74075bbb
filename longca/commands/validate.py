"""`longca validate`: check a spec and exit non-zero with the field named if it is wrong."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="validate a spec file")
    p.add_argument("spec")
    p.add_argument(
        "--gpu",
        action="store_true",
        help="also check the spec's gpu_model against this machine's GPUs (what `longca run` checks first)",
    )
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = load_spec(args.spec)
    if args.gpu:
        from longca.run.chunk import check_gpu_model

        check_gpu_model(spec)
    print(f"{args.spec}: valid ({len(expand(spec))} cells)" + (" for this machine's GPUs" if args.gpu else ""))
    return 0

"""`longca validate`: check a spec and exit non-zero with the field named if it is wrong."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="validate a spec file")
    p.add_argument("spec")
    p.set_defaults(func=_validate)


def _validate(args: argparse.Namespace) -> int:
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = load_spec(args.spec)
    print(f"{args.spec}: valid ({len(expand(spec))} cells)")
    return 0

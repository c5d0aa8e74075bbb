"""The `longca` command. Subcommands live one per module in longca.commands (add_parser(sub))."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


def build_parser() -> argparse.ArgumentParser:
    import longca
    import longca.commands as pkg

    parser = argparse.ArgumentParser(prog="longca", description=longca.__doc__)
    parser.add_argument("--version", action="version", version=f"longca {longca.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
        importlib.import_module(f"{pkg.__name__}.{mod}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ValueError, KeyError, FileNotFoundError) as exc:  # user errors: one clear line, no trace
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"longca: error: {msg}", file=sys.stderr)
        return 2
    except OSError as exc:  # a read-only or full disk, a folder not ours: one line naming the path
        where = exc.filename if exc.filename is not None else "(no path)"
        print(f"longca: error: {where}: {exc.strerror or exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

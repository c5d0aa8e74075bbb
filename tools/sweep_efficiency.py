"""A sweep's efficiency over the calls that ran it: summed timed kernel time over summed process wall.

The sweep-efficiency goal reads "summed timed kernel time over the sweep's wall time". Cell walls alone miss
process start-up, imports and scheduling, so the denominator here is the wall of every `longca run`
process that worked on the sweep, as tools/gpu-host.sh logs it (`process wall S s: ARGS`, one line
per process, in each call's logs folder, plain or gzipped). The numerator is every timed sample of
the sweep's current cells (the spec's digests: rows of superseded protocols are left out).

    python3 tools/sweep_efficiency.py --spec specs/h200.yaml --sweep dense \
        --rows results/h200/all.parquet --logs LOGS_OF_EACH_CALL ...

A process killed at a call's limit counts its whole wall and only the cells it finished: the ratio
can only be understated by it. The spec's cells still missing are reported, since a partial sweep's
ratio is not yet the sweep's.
"""

from __future__ import annotations

import argparse
import gzip
import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path

import polars as pl

WALL = re.compile(r"^process wall ([0-9.]+) s: (.*)$")


def read_lines(paths: Iterable[Path]) -> list[str]:
    """Every line of every log file (`*.log`, `*.log.gz`) under the given files or folders."""
    lines: list[str] = []
    for p in paths:
        files = sorted(p.rglob("*.log*")) if p.is_dir() else [p]
        for f in files:
            opener = gzip.open if f.suffix == ".gz" else open
            with opener(f, "rt", encoding="utf-8", errors="replace") as fh:
                lines.extend(fh.read().splitlines())
    return lines


def process_walls(lines: Iterable[str], sweep: str) -> list[float]:
    """Walls (s) of the processes whose `longca run` arguments select `sweep` (`--sweep NAME`)."""
    walls = []
    for line in lines:
        m = WALL.match(line.strip())
        if not m:
            continue
        args = shlex.split(m.group(2))
        if any(a == "--sweep" and b == sweep for a, b in zip(args, args[1:])):
            walls.append(float(m.group(1)))
    return walls


def timed_seconds(rows: pl.DataFrame, digests: set[str]) -> tuple[float, int]:
    """Summed timed samples (s) of the rows whose cell digest is in `digests`, and how many of
    those cells have rows."""
    mine = rows.filter(pl.col("cell_digest").is_in(list(digests)))
    timed = mine.get_column("samples_ms").list.sum().fill_null(0).sum() / 1000.0 if mine.height else 0.0
    return float(timed), mine.get_column("cell_digest").n_unique() if mine.height else 0


def main(argv: list[str] | None = None) -> int:
    from longca.spec.cells import expand, unknown_sweep
    from longca.spec.load import load_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--rows", nargs="+", required=True, help="result Parquet files (aggregates)")
    ap.add_argument("--logs", nargs="+", required=True, help="log files or folders with `process wall` lines")
    a = ap.parse_args(argv)
    spec = load_spec(a.spec)
    if error := unknown_sweep(a.sweep, spec.name, (sw.name for sw in spec.sweeps)):
        ap.error(error)
    cells = [c for c in expand(spec) if c.sweep == a.sweep]
    rows = pl.concat(
        [pl.read_parquet(p, columns=["cell_digest", "samples_ms"]) for p in a.rows], how="diagonal_relaxed"
    )
    timed, measured = timed_seconds(rows, {c.digest for c in cells})
    walls = process_walls(read_lines(Path(p) for p in a.logs), a.sweep)
    wall = sum(walls)
    print(
        f"{a.spec} sweep {a.sweep}: {measured} of {len(cells)} cells have rows; "
        f"{len(walls)} processes, {wall:.1f} s of process wall; {timed:.1f} s timed"
    )
    if wall > 0:
        print(f"timed / process wall = {timed / wall:.3f}")
    if measured < len(cells):
        print(f"{len(cells) - measured} cells still missing: not yet the whole sweep's ratio")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The command that re-measures a row's cell: `longca run` with the row's spec, sweep and one
`--only` per axis (the selection `longca.spec.select` understands), so a reader of a report or a
comparison can measure any number again."""

from __future__ import annotations

import glob
import shlex
from collections.abc import Sequence
from typing import Any

import polars as pl

from longca.report.load import read_tables

# `--only` keys and the row columns they take, in the command's order (heads joins two columns)
ONLY = (
    ("kernel", ("kernel",)),
    ("mask", ("mask",)),
    ("mask_variant", ("mask_variant",)),
    ("seqlen", ("seqlen_q",)),
    ("heads", ("heads_q", "heads_kv")),
    ("head_dim", ("head_dim",)),
    ("dtype", ("dtype",)),
    ("pass", ("pass",)),
    ("batch", ("batch",)),
)
CP_ONLY = (("cp_mechanism", ("cp_mechanism",)), ("world_size", ("world_size",)), ("cp_variant", ("cp_variant",)))


def repro_command(row: dict[str, Any]) -> str:
    """`longca run --spec specs/<spec>.yaml --sweep <sweep> --only ...` for the row's cell."""
    args = ["longca", "run", "--spec", f"specs/{row['spec']}.yaml", "--sweep", str(row["sweep"])]
    for key, columns in ONLY + (CP_ONLY if row.get("cp_mechanism") else ()):
        args += ["--only", f"{key}=" + ":".join(str(row[c]) for c in columns)]
    return shlex.join(args)


def with_repro(cells: pl.DataFrame) -> pl.DataFrame:
    """`cells` (one row per cell, with its axes, spec and sweep) with a `repro` column: its command."""
    needed = {c for _, cols in ONLY + CP_ONLY for c in cols} | {"spec", "sweep"}
    if cells.is_empty() or not needed <= set(cells.columns):
        return cells.with_columns(repro=pl.lit(None, pl.String))
    return cells.with_columns(
        repro=pl.struct(*sorted(needed)).map_elements(
            lambda r: repro_command(r) if r["spec"] and r["sweep"] else None, pl.String
        )
    )


def repro_selection_command(spec: str, sweeps: Sequence[str], row: dict[str, Any], omit: Sequence[str]) -> str:
    """`longca run` for the cells of one table row: the row's axes but the `omit`ted ones (a length
    series omits "seqlen", a kernel-by-kernel line "kernel"), over each sweep its cells come from."""
    args = ["longca", "run", "--spec", f"specs/{spec}.yaml"]
    for sweep in sorted(set(sweeps)):
        args += ["--sweep", str(sweep)]
    for key, columns in ONLY:
        if key not in omit:
            args += ["--only", f"{key}=" + ":".join(str(row[c]) for c in columns)]
    return shlex.join(args)


def selection_columns() -> list[pl.Expr]:
    """Aggregations that give a grouped table what `with_selection_repro` reads: its spec, how many
    specs its rows come from, and its sweeps (the group's other columns hold the axes)."""
    return [
        pl.col("spec").first().alias("spec"),
        pl.col("spec").n_unique().alias("_specs"),
        pl.col("sweep").drop_nulls().unique().sort().alias("_sweeps"),
    ]


def with_selection_repro(groups: pl.DataFrame, omit: Sequence[str]) -> pl.DataFrame:
    """`groups` (aggregated with `selection_columns`, one line per table row) with `repro`: the
    command that measures the line's cells again, every axis but `omit`; none for a line whose rows
    come from several specs. The helper columns are dropped."""
    if groups.is_empty():
        return groups.with_columns(repro=pl.lit(None, pl.String)).drop("_specs", "_sweeps")
    return groups.with_columns(
        repro=pl.struct(pl.all()).map_elements(
            lambda r: (
                repro_selection_command(r["spec"], r["_sweeps"], r, omit) if r["_specs"] == 1 and r["spec"] else None
            ),
            pl.String,
        )
    ).drop("_specs", "_sweeps")


def repro_expression() -> str:
    """The same command as a Vega expression over a drawn row (`datum`), for chart tooltips; null for
    rows without a spec (peer figures). Names and values here need no shell quoting."""

    def only(pairs) -> str:
        parts = []
        for key, columns in pairs:
            value = " + ':' + ".join(f"datum['{c}']" for c in columns)
            parts.append(f"' --only {key}=' + {value}")
        return " + ".join(parts)

    return (
        f"datum.spec && datum.sweep ? 'longca run --spec specs/' + datum.spec + '.yaml --sweep ' + datum.sweep"
        f" + {only(ONLY)} + (datum.cp_mechanism ? {only(CP_ONLY)} : '') : null"
    )


def find_rows(cell: str, paths: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The latest row of each cell whose id or digest is `cell` (or starts with it)."""
    files = list(paths) or sorted(glob.glob("results/*/all.parquet"))
    if not files:
        raise FileNotFoundError("no result sets to search: give --rows PARQUET (or run from the repository root)")
    rows = pl.from_arrow(read_tables(files))
    hits = rows.filter(
        (pl.col("cell_id") == cell)
        | pl.col("cell_digest").str.starts_with(cell.lstrip("@"))
        | pl.col("cell_id").str.ends_with(f"@{cell.lstrip('@')}")
    )
    if hits.height == 0:
        raise ValueError(f"no row of {', '.join(files)} has the cell {cell!r} (give a cell id or its digest)")
    latest = hits.sort("timestamp").unique(subset=["cell_digest"], keep="last", maintain_order=True)
    return latest.to_dicts()

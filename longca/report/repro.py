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


def repro_command(row: dict[str, Any]) -> str:
    """`longca run --spec specs/<spec>.yaml --sweep <sweep> --only ...` for the row's cell."""
    only = [
        f"kernel={row['kernel']}",
        f"mask={row['mask']}",
        f"seqlen={row['seqlen_q']}",
        f"heads={row['heads_q']}:{row['heads_kv']}",
        f"head_dim={row['head_dim']}",
        f"dtype={row['dtype']}",
        f"pass={row['pass']}",
        f"batch={row['batch']}",
    ]
    if row.get("cp_mechanism"):
        only += [f"cp_mechanism={row['cp_mechanism']}", f"world_size={row['world_size']}"]
    args = ["longca", "run", "--spec", f"specs/{row['spec']}.yaml", "--sweep", str(row["sweep"])]
    for o in only:
        args += ["--only", o]
    return shlex.join(args)


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

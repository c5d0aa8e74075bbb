"""One CP rank's local work measured on one GPU (benchmarks/cp_rank_local.py's JSON) as one table for
the report's CP page: what the ranks' kernels and combination cost, without any transfer, against the
single-GPU kernel. Beside the multi-GPU cells it separates compute from communication."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import polars as pl

COLUMNS = [
    "source",
    "pass",
    "mask",
    "balance",
    "heads",
    "tokens_per_gpu",
    "world",
    "mechanism",
    "kernel",
    "rank_ms",
    "cp_per_gpu_tflops",
    "cp_per_gpu_tflops_autograd",
    "single_kernel",
    "single_tflops",
    "ratio",
    "max_rel_err",
    "status",
]
_FLOATS = ("cp_per_gpu_tflops", "cp_per_gpu_tflops_autograd", "single_tflops", "ratio", "max_rel_err")
_INTS = ("tokens_per_gpu", "world")
NUMERIC = [c for c in COLUMNS if c in _FLOATS + _INTS]  # right-aligned in the report's table


def load(paths: Sequence[str | Path], shown: dict[Path, str] | None = None) -> pl.DataFrame:
    """One row per configuration of every file (a list, as the script writes it). Rows that were not
    timed (status incorrect or error) keep their status and errors, never a figure."""
    rows = []
    for path in map(Path, paths):
        for r in json.loads(path.read_text(encoding="utf-8")):
            ranks = r.get("ranks") or []
            key = "direct_ms" if ranks and "direct_ms" in ranks[0] else "ms"
            errs = [v for k, v in r.items() if k.startswith("rel_err_") and isinstance(v, (int, float))]
            rows.append(
                {
                    "source": (shown or {}).get(path, str(path)),
                    "pass": r.get("pass", "fwd"),
                    "mask": r.get("mask"),
                    "balance": r.get("balance"),
                    "heads": r.get("heads"),
                    "tokens_per_gpu": r.get("tokens_per_gpu"),
                    "world": r.get("world"),
                    "mechanism": r.get("mechanism"),
                    "kernel": r.get("kernel"),
                    "rank_ms": ", ".join(f"{x[key]:.2f}" for x in ranks) or None,
                    "cp_per_gpu_tflops": r.get("cp_per_gpu_tflops"),
                    "cp_per_gpu_tflops_autograd": r.get("cp_per_gpu_tflops_autograd"),
                    "single_kernel": r.get("single_kernel"),
                    "single_tflops": r.get("single_tflops"),
                    "ratio": r.get("ratio"),
                    "max_rel_err": max(errs) if errs else None,
                    "status": r.get("status"),
                }
            )
    schema = {c: pl.String for c in COLUMNS if c not in _FLOATS + _INTS}
    schema |= {c: pl.Float64 for c in _FLOATS} | {c: pl.Int64 for c in _INTS}
    return pl.DataFrame(rows, schema=schema).select(COLUMNS)


def shown_columns(table: pl.DataFrame) -> list[str]:
    """Every column but those empty in every row (the autograd figure exists for some backward runs only)."""
    return [c for c in COLUMNS if table.get_column(c).is_not_null().any()]

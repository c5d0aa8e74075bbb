"""Measured device ceilings (benchmarks/matmul_ceiling.py's JSON): the matrix-product rate per device
and dtype that the choose page puts each best kernel's TFLOP/s against."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import polars as pl

COLUMNS = [
    "source",
    "device_name",
    "dtype",
    "n",
    "matmul_tflops",
    "tflops_min",
    "tflops_max",
    "matmul_tflops_per_ghz",
    "rounds",
    "timestamp",
]
_NEEDED = ("what", "device_name", "dtype", "tflops", "round_tflops")


def per_ghz(rec: dict) -> float | None:
    """The record's best round rate per GHz of the SM clock sampled during that round (None where
    the record has no such clock per round): the ceiling at a row's in-window clock is this times
    the clock. Under a power cap a matmul's clock falls from round to round (an H100: 1815 to 1395
    MHz read after each round) while attention cells of a few milliseconds ran at up to 1980 MHz.
    The clock read after a round is not used: it lags the round (379-482 TFLOP/s per GHz by it)."""
    clocks = rec.get("clock_window_mhz") or []
    rates = rec["round_tflops"]
    if len(clocks) != len(rates) or not all(isinstance(c, (int, float)) and c > 0 for c in clocks):
        return None
    return max(float(r) / (float(c) / 1000.0) for r, c in zip(rates, clocks))


def load(paths: Sequence[str | Path], shown: dict[Path, str] | None = None) -> pl.DataFrame:
    """One row per (device, dtype): the latest record of the given files. A file that is not the
    script's output is refused, naming the file and what it lacks."""
    rows = []
    for path in map(Path, paths):
        try:
            records = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"--ceiling {path}: not readable as JSON ({exc})") from None
        if not isinstance(records, list):
            raise ValueError(f"--ceiling {path}: expected a list of records (benchmarks/matmul_ceiling.py's output)")
        for rec in records:
            missing = [k for k in _NEEDED if not isinstance(rec, dict) or k not in rec]
            if missing or rec.get("what") != "matmul":
                raise ValueError(
                    f"--ceiling {path}: a record lacks {missing or ['what: matmul']}; "
                    "expected benchmarks/matmul_ceiling.py's output"
                )
            rows.append(
                {
                    "source": (shown or {}).get(path, str(path)),
                    "device_name": rec["device_name"],
                    "dtype": rec["dtype"],
                    "n": rec.get("n"),
                    "matmul_tflops": float(rec["tflops"]),
                    "tflops_min": float(min(rec["round_tflops"])),
                    "tflops_max": float(max(rec["round_tflops"])),
                    "matmul_tflops_per_ghz": per_ghz(rec),
                    "rounds": len(rec["round_tflops"]),
                    "timestamp": rec.get("timestamp"),
                }
            )
    if not rows:
        return pl.DataFrame(schema={c: pl.String for c in COLUMNS})
    df = pl.DataFrame(rows).select(COLUMNS)
    return (
        df.sort("timestamp", nulls_last=False)
        .unique(["device_name", "dtype"], keep="last")
        .sort("device_name", "dtype")
    )

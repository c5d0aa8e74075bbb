"""Timer fidelity checks (benchmarks/timer_fidelity.py's JSON or Parquet) as one table for the report:
longca's timer against a bare `triton.testing.do_bench` loop on the same call in the same process."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

import polars as pl

GOAL = 0.02  # longca's figure within 2% of do_bench's where both time the same thing (docs/measurement.md)

COLUMNS = [
    "source",
    "device",
    "protocol",
    "kernel",
    "mask",
    "heads",
    "seqlen",
    "pass",
    "rounds",
    "longca_ms",
    "do_bench_ms",
    "ratio",
    "worst_round",
    "matched_ratio",
    "within_goal",
]


def protocol_label(protocol: dict | None) -> str:
    """How longca's timer ran: the fixed 5 + 20 calls of the first checks, or a sweep's protocol."""
    if not protocol:
        return "fixed: 5 warm-up, 20 timed calls"
    warm = (
        f"warm-up cut at {protocol['warmup_s'] * 1000:g} ms"
        if protocol.get("warmup_s")
        else f"{protocol.get('warmup', 0)} warm-up calls"
    )
    return f"{warm}, {protocol.get('min_iters')}-{protocol.get('iters')} timed calls in {protocol.get('budget_s'):g} s"


def _cases(path: Path) -> list[dict]:
    """A file's cases: a JSON list, or a Parquet table (its `protocol` column JSON text)."""
    if path.suffix == ".parquet":
        cases = pl.read_parquet(path).to_dicts()
        for case in cases:
            if isinstance(case.get("protocol"), str):
                case["protocol"] = json.loads(case["protocol"])
        return [{k: v for k, v in c.items() if v is not None} for c in cases]
    return json.loads(path.read_text(encoding="utf-8"))


def load_checks(paths: Sequence[str | Path], shown: dict[Path, str] | None = None) -> pl.DataFrame:
    """One row per case of every file (a list of cases as the script writes it); a case that could
    not run keeps its error text. `shown`: how to name each file (default: its path)."""
    rows = []
    for path in map(Path, paths):
        for case in _cases(path):
            ratios = case.get("ratios") or ([case["ratio"]] if "ratio" in case else [])
            worst = max(ratios, key=lambda r: abs(r - 1.0)) if ratios else None
            ratio = case.get("ratio")
            rows.append(
                {
                    "source": (shown or {}).get(path, str(path)),
                    "device": case.get("device"),
                    "protocol": protocol_label(case.get("protocol")),
                    "kernel": case.get("kernel"),
                    "mask": case.get("mask"),
                    "heads": case.get("heads"),
                    "seqlen": case.get("seqlen"),
                    "pass": case.get("pass") or "fwd",  # the first checks timed forwards only
                    "rounds": len(ratios) or None,
                    "longca_ms": case.get("longca_median_ms"),
                    "do_bench_ms": case.get("do_bench_median_ms"),
                    "ratio": ratio,
                    "worst_round": worst,
                    "matched_ratio": case.get("matched_ratio"),
                    "within_goal": None if ratio is None else ("yes" if abs(ratio - 1.0) <= GOAL else "no"),
                    "error": case.get("error"),
                }
            )
    schema = {
        c: pl.String
        for c in ("source", "device", "protocol", "kernel", "mask", "heads", "pass", "within_goal", "error")
    }
    schema |= {"seqlen": pl.Int64, "rounds": pl.Int64}
    schema |= {c: pl.Float64 for c in ("longca_ms", "do_bench_ms", "ratio", "worst_round", "matched_ratio")}
    return pl.DataFrame(rows, schema=schema)


def summary(checks: pl.DataFrame) -> str:
    """A sentence per file: how many of its cases met the goal, and the spread of their ratios."""
    parts = []
    for (source,), g in checks.group_by("source", maintain_order=True):
        ok = g.filter(pl.col("ratio").is_not_null())
        if not ok.height:
            parts.append(f"{source}: no case ran.")
            continue
        met = ok.filter(pl.col("within_goal") == "yes").height
        lo, hi = ok.get_column("ratio").min(), ok.get_column("ratio").max()
        med = statistics.median(ok.get_column("ratio").to_list())
        parts.append(
            f"{source}: {met} of {ok.height} cases within {GOAL:.0%} (ratios {lo:.4f}-{hi:.4f}, median {med:.4f})."
        )
    return " ".join(parts)

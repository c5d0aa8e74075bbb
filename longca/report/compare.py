"""A/B verdicts between two result sets: which cells got faster, slower, stayed the same, or cannot
be told apart from noise, with a confidence interval on every time ratio.

Rows are matched by their axes (MATCH_ON: kernel, mask and its resolved parameters and draw,
lengths, heads, head dims, dtype, pass, batch, world size, CP mechanism, degrees, balance), never by
digest: a protocol or version change alters digests. Each side keeps its latest measurement of a
cell (`longca.report.queries.supersede`, then the latest per axes).

The ratio is NEW median time / BASE median time (> 1: slower). Its interval comes from the stored
samples: each side's median gets a distribution-free interval from order statistics (the ranks
n/2 -+ z sqrt(n)/2 of its sorted samples, z for 97.5% coverage; all samples when n <= 5), and the
ratio's interval is [new low / base high, new high / base low], which covers the true ratio with
at least 95% probability (Bonferroni over the two sides). Verdicts, with threshold t:

    faster: interval below 1 - t;  slower: interval above 1 + t;  same: interval inside [1 - t, 1 + t];
    noisy: the interval straddles 1 - t or 1 + t;  status changed: the two statuses differ;
    only in base / only in new: no row on the other side.

A row compared with the very same measurement (same run, cell digest and samples) is `same` with
ratio 1 and interval [1, 1].

Whether a re-run reproduces a published set within its stated uncertainty: for every cell ok on
both sides whose base row stores its 95% interval (`ci_low_ms`, `ci_high_ms`), `inside_base_ci`
says whether the new median falls inside it; the summary counts them (a re-run of random published
cells on a fresh machine: the share inside is what the published intervals are worth).

An interval is the uncertainty of one run on one machine at the clock it held. Between machine
leases the H200's SM clock under load moves (power cap, temperature), and every cell's time moves
with it. So where both rows record the in-window SM clock (`clock_window_mhz`), a record also has
`clock_ratio` (base clock / new clock: the time ratio the clock alone predicts, time taken as
inversely proportional to clock) and `inside_base_ci_at_base_clock` (the new median scaled to the
base's clock, inside the base's interval); the summary gives the median time ratio beside the
median clock ratio, so a shift of the whole set is told apart from a change of the kernels.

With earlier runs of some of the base's cells (`reruns`: e.g. results/h200/reruns.parquet), the
move between runs is measured as the report measures it (`longca.report.leases`), and
`inside_rerun_interval` says whether the new median falls inside the base row's re-run interval
(its 95% interval widened to the 95th percentile of the moves of its time scale, `rerun_scale`;
the summary counts them per scale). Rows of the new set must not be
among `reruns`: the check is then a prediction made before the re-run, and can fail.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from longca.report.assets import CSS
from longca.report.leases import MIN_PAIRS, BetweenRuns, ScaleMoves, between_runs, rerun_interval
from longca.report.load import read_tables
from longca.report.queries import supersede
from longca.report.repro import repro_command
from longca.store.schema import REQUIRED, SCHEMA_VERSION
from longca.vocab import Status, Verdict

MATCH_ON = (
    "kernel",
    "mask",
    "mask_params",
    "mask_sample",
    "seqlen_q",
    "seqlen_k",
    "batch",
    "heads_q",
    "heads_kv",
    "head_dim",
    "head_dim_v",
    "dtype",
    "pass",
    "world_size",
    "cp_mechanism",
    "cp_degrees",
    "cp_balance",
)
VERDICTS = tuple(v.value for v in Verdict)
ENV_FACTS = (
    "device_name",
    "driver",
    "cuda",
    "cudnn",
    "torch",
    "triton",
    "packages",
    "compute_capability",
    "longca_version",
    "git_commit",
)
Z_SIDE = 2.2414  # two-sided 97.5% normal quantile: each side's median interval, >= 95% jointly


@dataclass
class Comparison:
    records: list[dict[str, Any]]  # one per matched key: axes, verdict, ratio, interval, statuses
    summary: dict[str, Any]
    environment: list[dict[str, Any]]  # facts that differ between the sides: fact, base, new


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        agg = path / "all.parquet"
        return [agg] if agg.is_file() else sorted(path.rglob("*.parquet"))
    if not path.exists():
        raise FileNotFoundError(f"no such result set: {path}")
    return [path]


def read_side(path: str | Path) -> pl.DataFrame:
    """Every row of one result set (an aggregate, or a results folder), checked to be longca's."""
    files = _files(Path(path))
    if not files:
        raise ValueError(f"{path}: no Parquet files (expected an aggregate such as results/<spec>/all.parquet)")
    for f in files:
        names = set(pq.read_schema(f).names)
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise ValueError(f"{f}: not a longca result table (missing columns {missing})")
        versions = pq.read_table(f, columns=["schema_version"]).column("schema_version").drop_null().to_pylist()
        newer = sorted({v for v in versions if v > SCHEMA_VERSION})
        if newer:
            raise ValueError(
                f"{f}: schema_version {newer} is newer than this longca reads ({SCHEMA_VERSION}); update longca"
            )
    return pl.from_arrow(read_tables(files))


def current(rows: pl.DataFrame) -> pl.DataFrame:
    """A result set's latest measurement of each cell: what a comparison matches."""
    rows, _ = supersede(rows)
    return rows.sort("timestamp", nulls_last=False).unique(subset=list(MATCH_ON), keep="last", maintain_order=True)


def median_interval(samples: Sequence[float]) -> tuple[float, float, float]:
    """(median, low, high): the median and its distribution-free interval (order statistics)."""
    x = np.sort(np.asarray([s for s in samples if s is not None and math.isfinite(s)], dtype=float))
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    med = float(np.median(x))
    if n <= 5:
        return med, float(x[0]), float(x[-1])
    half = Z_SIDE * math.sqrt(n) / 2
    lo = max(0, math.floor(n / 2 - half))
    hi = min(n - 1, math.ceil(n / 2 + half) - 1)
    return med, float(x[lo]), float(x[hi])


def ratio_interval(base: Sequence[float], new: Sequence[float]) -> tuple[float, float, float]:
    """(ratio of medians new / base, low, high)."""
    b, b_lo, b_hi = median_interval(base)
    n, n_lo, n_hi = median_interval(new)
    if not (b > 0 and b_lo > 0):
        return math.nan, math.nan, math.nan
    return n / b, n_lo / b_hi, n_hi / b_lo


def verdict(ratio: float, low: float, high: float, threshold: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)):
        return "noisy"
    if high < 1 - threshold:
        return "faster"
    if low > 1 + threshold:
        return "slower"
    if low >= 1 - threshold and high <= 1 + threshold:
        return "same"
    return "noisy"


def _samples(row: dict[str, Any]) -> list[float]:
    s = row.get("samples_ms")
    if s:
        return list(s)
    return [row["median_ms"]] if row.get("median_ms") is not None else []


def compare(
    base: str | Path, new: str | Path, threshold: float = 0.03, reruns: Sequence[str | Path] = ()
) -> Comparison:
    """Match two result sets by axes and give every cell its verdict (and, given earlier runs of
    the base's cells in `reruns`, whether each new median is inside the base's re-run interval)."""
    if not 0 < threshold < 1:
        raise ValueError(f"--threshold {threshold}: allowed: a fraction between 0 and 1, e.g. 0.03")
    base_rows = read_side(base)
    a, b = current(base_rows), current(read_side(new))
    keys = list(MATCH_ON)
    joined = a.join(b, on=keys, how="full", nulls_equal=True, suffix="_new", coalesce=True)
    moves = _moves(base, base_rows, reruns) if reruns else None
    if moves is not None:
        p95 = moves.p95_at(pl.col("median_ms"))
        low, high = rerun_interval(p95, pl.col("median_ms"), pl.col("ci_low_ms"), pl.col("ci_high_ms"))
        joined = joined.with_columns(low.alias("rerun_low_ms"), high.alias("rerun_high_ms"))
    if joined.height and a.join(b, on=keys, how="inner", nulls_equal=True).height == 0:
        raise ValueError(
            f"nothing matched: no cell of {base} has the axes of a cell of {new} (matched on {', '.join(MATCH_ON)})"
        )
    records = []
    for row in joined.iter_rows(named=True):
        rec: dict[str, Any] = {k: row[k] for k in keys}
        s_base, s_new = row.get("status"), row.get("status_new")
        rec.update(
            status_base=s_base,
            status_new=s_new,
            ratio=None,
            ratio_ci_low=None,
            ratio_ci_high=None,
            median_ms_base=row.get("median_ms"),
            median_ms_new=row.get("median_ms_new"),
            device_base=row.get("device_name"),
            device_new=row.get("device_name_new"),
            cell_id=row.get("cell_id_new") or row.get("cell_id"),
        )
        spec, sweep = (
            (row.get("spec_new"), row.get("sweep_new")) if s_new is not None else (row.get("spec"), row.get("sweep"))
        )
        side = "_new" if s_new is not None else ""
        variants = {k: row.get(k + side) for k in ("mask_variant", "cp_variant")}
        rec["repro"] = repro_command({**rec, "spec": spec, "sweep": sweep, **variants}) if spec and sweep else None
        if s_base is None:
            rec["verdict"] = "only in new"
        elif s_new is None:
            rec["verdict"] = "only in base"
        elif s_base != s_new:
            rec["verdict"] = "status changed"
        elif s_base != Status.OK:
            rec["verdict"] = "same"  # both failed alike (e.g. unsupported on both)
        else:
            base_samples = _samples(row)
            new_samples = _samples({"samples_ms": row.get("samples_ms_new"), "median_ms": row.get("median_ms_new")})
            identical = (
                row.get("run_id") == row.get("run_id_new")
                and row.get("cell_digest") == row.get("cell_digest_new")
                and base_samples == new_samples
            )
            r, lo, hi = (1.0, 1.0, 1.0) if identical else ratio_interval(base_samples, new_samples)
            rec.update(ratio=r, ratio_ci_low=lo, ratio_ci_high=hi, verdict=verdict(r, lo, hi, threshold))
            ci_lo, ci_hi, med_new = row.get("ci_low_ms"), row.get("ci_high_ms"), row.get("median_ms_new")
            if ci_lo is not None and ci_hi is not None and med_new is not None:
                rec["inside_base_ci"] = bool(ci_lo <= med_new <= ci_hi)
                if moves is not None:
                    rec["inside_rerun_interval"] = bool(row["rerun_low_ms"] <= med_new <= row["rerun_high_ms"])
                    rec["rerun_scale"] = _scale_label(moves.scale_of(row["median_ms"]))
            clk, clk_new = row.get("clock_window_mhz"), row.get("clock_window_mhz_new")
            if clk and clk_new:
                rec["clock_ratio"] = clk / clk_new
                if "inside_base_ci" in rec:
                    rec["inside_base_ci_at_base_clock"] = bool(ci_lo <= med_new * clk_new / clk <= ci_hi)
        records.append(rec)
    records.sort(
        key=lambda r: (
            -abs(math.log(r["ratio"])) if r["ratio"] and r["ratio"] > 0 else 0.0,
            r["kernel"] or "",
            r["mask"] or "",
        )
    )
    summary = _summary(records, threshold, base, new)
    if moves is not None:
        judged = [r for r in records if "inside_rerun_interval" in r]
        summary.update(
            rerun_p95=moves.p95,
            rerun_pairs=moves.pairs,
            inside_rerun_interval=sum(1 for r in judged if r["inside_rerun_interval"]),
            # per time scale of the base's median: the move it was widened by, and how many landed inside
            # (rows at a scale without pairs last, where there are any)
            rerun_scales=[
                dict(
                    scale=_scale_label(s),
                    p95=moves.used(s),
                    pairs=s.pairs if s else 0,
                    inside=sum(1 for r in here if r["inside_rerun_interval"]),
                    of=len(here),
                )
                for s in (*moves.scales, None)
                if (here := [r for r in judged if r["rerun_scale"] == _scale_label(s)]) or s is not None
            ],
        )
    return Comparison(records, summary, _environment(a, b))


def _scale_label(scale: ScaleMoves | None) -> str:
    return scale.label() if scale is not None else "no pairs at its scale"


def _moves(base: str | Path, base_rows: pl.DataFrame, reruns: Sequence[str | Path]) -> BetweenRuns:
    """The move between runs of the base's cells: its rows and the earlier runs in `reruns`."""
    for p in reruns:
        if not Path(p).is_file():
            raise ValueError(f"--reruns {p}: no such file (expected rows of earlier runs, e.g. reruns.parquet)")
    moves = between_runs(base_rows, pl.from_arrow(read_tables(list(reruns))))
    if moves is None:
        raise ValueError(
            f"--reruns {', '.join(map(str, reruns))}: no cell of {base} is there from another run "
            "(same cell digest and mask draw, another run_id), so no move between runs can be measured"
        )
    return moves


def _summary(records: list[dict[str, Any]], threshold: float, base, new) -> dict[str, Any]:
    def counts(by: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for r in records:
            slot = out.setdefault(r[by], {}) if by else out
            slot[r["verdict"]] = slot.get(r["verdict"], 0) + 1
        return out

    return {
        "base": str(base),
        "new": str(new),
        "threshold": threshold,
        "matched_on": list(MATCH_ON),
        "rows": len(records),
        "verdicts": counts(None),
        # new medians inside the base's published 95% interval, of the cells where the base has one
        "inside_base_ci": sum(1 for r in records if r.get("inside_base_ci")),
        "with_base_ci": sum(1 for r in records if r.get("inside_base_ci") is not None),
        "inside_base_ci_at_base_clock": sum(1 for r in records if r.get("inside_base_ci_at_base_clock")),
        "with_clocks": sum(1 for r in records if r.get("inside_base_ci_at_base_clock") is not None),
        "median_ratio": _median([r["ratio"] for r in records if r["ratio"] is not None]),
        "median_clock_ratio": _median([r["clock_ratio"] for r in records if r.get("clock_ratio") is not None]),
        "by_kernel": counts("kernel"),
        "by_mask": counts("mask"),
    }


def _median(xs: list[float]) -> float | None:
    return float(np.median(xs)) if xs else None


def _environment(a: pl.DataFrame, b: pl.DataFrame) -> list[dict[str, Any]]:
    """Environment facts (and SM clocks) whose values differ between the sides: each side's
    distinct values, sorted."""
    out = []
    for fact in ENV_FACTS:
        va = sorted({str(v) for v in a.get_column(fact).drop_nulls().to_list()}) if fact in a.columns else []
        vb = sorted({str(v) for v in b.get_column(fact).drop_nulls().to_list()}) if fact in b.columns else []
        if va != vb:
            out.append({"fact": fact, "base": va, "new": vb})
    clocks = [_clocks(a), _clocks(b)]
    if clocks[0] != clocks[1]:
        out.append({"fact": "SM clock at the end of ok rows", "base": clocks[0:1], "new": clocks[1:2]})
    return out


def _values(values: list[str], most: int | None = None) -> str:
    """A side's values of a fact, at most `most` of them named (a published set spans many commits)."""
    if not values or values == [""]:
        return "-"
    shown = values if most is None or len(values) <= most else values[:most]
    more = f" (+{len(values) - len(shown)} more)" if len(shown) < len(values) else ""
    return ", ".join(shown) + more


def _clocks(frame: pl.DataFrame) -> str:
    values = frame.filter(pl.col("status") == Status.OK).get_column("clock_end_mhz").drop_nulls()
    return f"median {values.median():.0f} MHz, min {values.min()} MHz" if len(values) else ""


def write_json(c: Comparison, path: str | Path) -> None:
    Path(path).write_text(
        json.dumps({"summary": c.summary, "environment": c.environment, "rows": c.records}, indent=1, default=str),
        encoding="utf-8",
    )


def summary_text(c: Comparison) -> str:
    s = c.summary
    lines = [
        f"compared {s['rows']} cells of {s['base']} (base) and {s['new']} (new), threshold "
        f"{s['threshold']:.0%}; matched on {', '.join(s['matched_on'])}",
        "verdicts: " + ", ".join(f"{v} {s['verdicts'][v]}" for v in VERDICTS if v in s["verdicts"]),
    ]
    if s["with_base_ci"]:
        share = s["inside_base_ci"] / s["with_base_ci"]
        lines.append(
            f"new medians inside the base's 95% interval: {s['inside_base_ci']} of {s['with_base_ci']} ({share:.0%})"
        )
    if "rerun_p95" in s and s["with_base_ci"]:
        inside = s["inside_rerun_interval"]
        lines.append(
            f"new medians inside the base's re-run interval (its 95% interval widened to the move between "
            f"runs of its time scale, 95th percentile of {s['rerun_pairs']} pairs): "
            f"{inside} of {s['with_base_ci']} ({inside / s['with_base_ci']:.0%})"
        )
        for sc in s["rerun_scales"]:
            share = f" ({sc['inside'] / sc['of']:.0%})" if sc["of"] else ""
            lines.append(
                f"  {sc['scale']}: widened by {sc['p95']:.1%} ({sc['pairs']} pairs"
                f"{'' if sc['pairs'] >= MIN_PAIRS else ': too few, the widest move'}): "
                f"{sc['inside']} of {sc['of']}{share}"
            )
    if s["with_clocks"]:
        lines.append(
            f"median time ratio new/base {s['median_ratio']:.3f}; the in-window SM clocks alone predict "
            f"{s['median_clock_ratio']:.3f}; at the base's clock {s['inside_base_ci_at_base_clock']} of "
            f"{s['with_clocks']} new medians are inside ({s['inside_base_ci_at_base_clock'] / s['with_clocks']:.0%})"
        )
    for r in [r for r in c.records if r["verdict"] in ("slower", "faster")][:10]:
        lines.append(
            f"  {r['verdict']:6} x{r['ratio']:.3f} [{r['ratio_ci_low']:.3f}, {r['ratio_ci_high']:.3f}]  {r['cell_id']}"
        )
    for e in c.environment:
        lines.append(f"  environment: {e['fact']}: base {_values(e['base'], 3)} | new {_values(e['new'], 3)}")
    return "\n".join(lines)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>longca compare</title>
<style>{css}

td.faster {{ background: #e8f5e9; }} td.slower {{ background: #ffebee; }} td.noisy {{ background: #fffde7; }}
td.status-changed {{ background: #fff3e0; }}
</style></head><body>
<header><span class="title">longca compare</span></header>
<main><h1>{base} &rarr; {new}</h1>
<p class="note">Time ratio new / base of each cell's median (&gt; 1: slower), with an interval of at least 95%
from the stored samples; verdicts at a threshold of {threshold}. Matched on {matched}.</p>
<h2>Verdicts</h2>{counts}
<h2>Environment that differs</h2>{env}
<h2>Cells</h2>
<p>kernel <select id="f-kernel"><option value="">all</option>{kernels}</select>
mask <select id="f-mask"><option value="">all</option>{masks}</select>
verdict <select id="f-verdict"><option value="">all</option>{verdicts}</select></p>
<table id="cells"><thead><tr>{head}</tr></thead><tbody>
{rows}
</tbody></table>
<script>
(function () {{
  var ids = ["kernel", "mask", "verdict"];
  function apply() {{
    var want = ids.map(function (k) {{ return document.getElementById("f-" + k).value; }});
    Array.prototype.forEach.call(document.querySelectorAll("#cells tbody tr"), function (tr) {{
      var show = ids.every(function (k, i) {{ return !want[i] || tr.getAttribute("data-" + k) === want[i]; }});
      tr.style.display = show ? "" : "none";
    }});
  }}
  ids.forEach(function (k) {{ document.getElementById("f-" + k).addEventListener("change", apply); }});
}})();
</script>
</main></body></html>
"""
ONE_SIDED_SHOWN = 500  # more cells on one side only are counted, not listed, on the page
COLUMNS = (
    "verdict",
    "ratio",
    "ratio_ci_low",
    "ratio_ci_high",
    "median_ms_base",
    "median_ms_new",
    "status_base",
    "status_new",
    "kernel",
    "mask",
    "seqlen_q",
    "heads_q",
    "heads_kv",
    "head_dim",
    "dtype",
    "pass",
    "world_size",
    "cp_mechanism",
    "mask_sample",
    "cell_id",
    "repro",
)


def write_html(c: Comparison, out_dir: str | Path) -> Path:
    """One page in the report's style: verdict counts, the environment diff, every cell sorted by
    effect with filters by kernel, mask and verdict. Every text from the rows is escaped."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    esc = html.escape

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else esc(str(v))

    def table(rows: list[list[Any]], head: list[str]) -> str:
        body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows)
        return (
            f"<table><thead><tr>{''.join(f'<th>{esc(h)}</th>' for h in head)}</tr></thead><tbody>{body}</tbody></table>"
        )

    s = c.summary
    counts = table([[v, s["verdicts"].get(v, 0)] for v in VERDICTS], ["verdict", "cells"])
    env = (
        table([[e["fact"], _values(e["base"]), _values(e["new"])] for e in c.environment], ["fact", "base", "new"])
        if c.environment
        else "<p>None of the recorded facts differ.</p>"
    )
    options = {k: sorted({str(r[k]) for r in c.records if r[k] is not None}) for k in ("kernel", "mask", "verdict")}
    rows = []
    one_sided = [r for r in c.records if r["verdict"] in ("only in base", "only in new")]
    shown = c.records if len(one_sided) <= ONE_SIDED_SHOWN else [r for r in c.records if r["verdict"] in VERDICTS[:5]]
    for r in shown:
        attrs = " ".join(f'data-{k}="{esc(str(r[k]))}"' for k in ("kernel", "mask", "verdict"))
        tds = "".join(
            f'<td class="{esc(r["verdict"].replace(" ", "-"))}">{cell(r[k])}</td>'
            if k == "verdict"
            else f"<td>{cell(r[k])}</td>"
            for k in COLUMNS
        )
        rows.append(f"<tr {attrs}>{tds}</tr>")
    if len(shown) < len(c.records):
        counts += (
            f'<p class="note">The {len(one_sided)} cells on one side only are counted above and listed '
            f"in the JSON output (--json), not below.</p>"
        )
    page = PAGE.format(
        css=CSS,
        base=esc(s["base"]),
        new=esc(s["new"]),
        threshold=f"{s['threshold']:.0%}",
        matched=esc(", ".join(s["matched_on"])),
        counts=counts,
        env=env,
        kernels="".join(f"<option>{esc(k)}</option>" for k in options["kernel"]),
        masks="".join(f"<option>{esc(k)}</option>" for k in options["mask"]),
        verdicts="".join(f"<option>{esc(k)}</option>" for k in options["verdict"]),
        head="".join(f"<th>{esc(h)}</th>" for h in COLUMNS),
        rows="\n".join(rows),
    )
    path = out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path

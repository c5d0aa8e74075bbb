"""Static exports of every chart for papers (SVG, PNG, Vega-Lite JSON, CSV) and the Vega bundle.

Rendering is the slow part of a build, so it runs in worker processes (longca.report.render), one
per core, each given a share of the charts balanced by spec size. The bundle depends only on the
versions, so it is cached per user and copied into each report.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import polars as pl
import vl_convert

from longca.report.assets import vl_version
from longca.report.charts import ChartSpec


def csv_safe(df: pl.DataFrame) -> pl.DataFrame:
    """CSV has no lists or structs: write lists as '[a, b, ...]'."""
    nested = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Array))]
    return df.with_columns(
        pl.concat_str([pl.lit("["), pl.col(c).cast(pl.List(pl.String)).list.join(", "), pl.lit("]")]).alias(c)
        for c in nested
    )


def bundle_cache() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longca"
    return root / f"vega-bundle-vlc{vl_convert.__version__}-vl{vl_version()}.js"


def _shares(jobs: list[tuple[int, str]], n: int, first_load: int) -> list[list[str]]:
    """Greedy split of (cost, stem) jobs into n lists of similar total cost."""
    loads, shares = [first_load] + [0] * (n - 1), [[] for _ in range(n)]  # type: list[int], list[list[str]]
    for cost, stem in sorted(jobs, reverse=True):
        i = loads.index(min(loads))
        loads[i] += cost
        shares[i].append(stem)
    return shares


def export(
    charts: Iterable[ChartSpec],
    specs: dict[str, dict[str, Any]],
    out: Path,
    png: bool = True,
    workers: int | None = None,
    charts_too: bool = True,
) -> None:
    """Write assets/vega-bundle.js and, with `charts_too`, charts/<id>.{vl.json,csv,svg,png} for each chart."""
    d = out / "charts"
    (out / "assets").mkdir(parents=True, exist_ok=True)
    jobs = []
    if charts_too:
        d.mkdir(parents=True, exist_ok=True)
    for c in charts if charts_too else ():
        text = json.dumps(specs[c.id], indent=1)
        (d / f"{c.id}.vl.json").write_text(text, encoding="utf-8")
        csv_safe(c.data).write_csv(d / f"{c.id}.csv")
        jobs.append((len(text), str(d / c.id)))
    cached = bundle_cache()
    need_bundle = not cached.exists()
    tmp_bundle = cached.with_suffix(f".{os.getpid()}.tmp")
    if need_bundle:
        cached.parent.mkdir(parents=True, exist_ok=True)
    n = max(1, min(workers or os.cpu_count() or 1, len(jobs) + need_bundle))
    # the bundle costs about as much as ten large charts: count it in worker 0's share
    shares = _shares(jobs, n, first_load=max((j[0] for j in jobs), default=1) * 10 if need_bundle else 0)
    with tempfile.TemporaryDirectory(prefix="longca-render-") as tmp:
        procs = []
        for i, share in enumerate(shares):
            if not share and not (i == 0 and need_bundle):
                continue
            job = Path(tmp) / f"job{i}.json"
            job.write_text(
                json.dumps(
                    {
                        "vl_version": vl_version(),
                        "png": png,
                        "charts": share,
                        "bundle": str(tmp_bundle) if (i == 0 and need_bundle) else None,
                    }
                )
            )
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "longca.report.render", str(job)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        failures = []
        for p in procs:
            _, err = p.communicate()
            if p.returncode:
                failures.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
    if failures:
        raise RuntimeError("chart export failed: " + "; ".join(failures))
    if need_bundle:
        os.replace(tmp_bundle, cached)
    shutil.copyfile(cached, out / "assets" / "vega-bundle.js")

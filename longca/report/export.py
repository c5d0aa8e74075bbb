"""Static exports of every chart for papers (SVG, PNG, Vega-Lite JSON, CSV) and the Vega bundle.

Rendering is the slow part of a build, so it runs in a pool of worker processes (one per core,
spawned: vl-convert runs threads that fork would not copy). The bundle depends only on the versions,
so it is cached per user and copied into each report.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import polars as pl
import vl_convert

from longca.report import render
from longca.report.assets import vl_version
from longca.report.charts import ChartSpec


def csv_safe(df: pl.DataFrame) -> pl.DataFrame:
    """CSV has no lists or structs: write lists as '[a, b, ...]'."""
    nested = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Array))]
    return df.with_columns(
        pl.concat_str([pl.lit("["), pl.col(c).cast(pl.List(pl.String)).list.join(", "), pl.lit("]")]).alias(c)
        for c in nested)


def bundle_cache() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longca"
    return root / f"vega-bundle-vlc{vl_convert.__version__}-vl{vl_version()}.js"


def export(charts: Iterable[ChartSpec], specs: dict[str, dict[str, Any]], out: Path, png: bool = True,
           workers: int | None = None) -> None:
    """Write charts/<id>.{svg,png,vl.json,csv} for each chart and assets/vega-bundle.js."""
    d = out / "charts"
    d.mkdir(parents=True, exist_ok=True)
    (out / "assets").mkdir(parents=True, exist_ok=True)
    version = vl_version()
    jobs = []
    for c in charts:
        text = json.dumps(specs[c.id], indent=1)
        (d / f"{c.id}.vl.json").write_text(text, encoding="utf-8")
        csv_safe(c.data).write_csv(d / f"{c.id}.csv")
        jobs.append((text, str(d / c.id)))
    cached = bundle_cache()
    workers = workers or max(1, min(os.cpu_count() or 1, len(jobs) + (not cached.exists())))
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures: list[Future[str]] = []
        if not cached.exists():
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp")
            futures.append(pool.submit(render.bundle, str(tmp), version))
        # largest specs first, so one long chart does not finish alone at the end
        for text, stem in sorted(jobs, key=lambda j: -len(j[0])):
            futures.append(pool.submit(render.chart_files, text, stem, version, png))
        for f in futures:
            f.result()
    if not cached.exists():
        os.replace(tmp, cached)
    shutil.copyfile(cached, out / "assets" / "vega-bundle.js")

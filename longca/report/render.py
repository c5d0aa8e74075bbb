"""Work done by vl-convert, run as worker processes: chart SVG/PNG and the Vega JavaScript bundle.

vl-convert serialises calls inside one process, so threads do not help; separate processes do. They
are plain `python -m longca.report.render JOBS.json` subprocesses rather than a multiprocessing pool:
a spawned pool re-imports the caller's __main__, which breaks builds started from stdin, notebooks or
unguarded scripts. This module imports nothing heavier than vl-convert.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import vl_convert

PNG_SCALE = 2.0


def chart_files(stem: str, vl_version: str, png: bool) -> None:
    """<stem>.vl.json -> <stem>.svg, and <stem>.png rasterised from that SVG (no second layout)."""
    spec = json.loads(Path(stem + ".vl.json").read_text(encoding="utf-8"))
    svg = vl_convert.vegalite_to_svg(spec, vl_version=vl_version)
    Path(stem + ".svg").write_text(svg, encoding="utf-8")
    if png:
        Path(stem + ".png").write_bytes(vl_convert.svg_to_png(svg, scale=PNG_SCALE))


def bundle(path: str, vl_version: str) -> None:
    """The Vega + Vega-Lite + vega-embed bundle for classic <script> use."""
    Path(path).write_text(vl_convert.javascript_bundle(vl_version=vl_version), encoding="utf-8")


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    if job.get("bundle"):
        bundle(job["bundle"], job["vl_version"])
    for stem in job["charts"]:
        chart_files(stem, job["vl_version"], job["png"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Work done by vl-convert, run in worker processes: chart SVG/PNG and the Vega JavaScript bundle.

vl-convert serialises calls inside one process, so threads do not help; separate processes do. This
module imports nothing but vl-convert so a worker starts fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import vl_convert

PNG_SCALE = 2.0


def chart_files(spec_json: str, stem: str, vl_version: str, png: bool) -> str:
    """Write <stem>.svg (and <stem>.png, rasterised from that SVG) for one Vega-Lite spec."""
    svg = vl_convert.vegalite_to_svg(json.loads(spec_json), vl_version=vl_version)
    Path(stem + ".svg").write_text(svg, encoding="utf-8")
    if png:
        Path(stem + ".png").write_bytes(vl_convert.svg_to_png(svg, scale=PNG_SCALE))
    return stem


def bundle(path: str, vl_version: str) -> str:
    """The Vega + Vega-Lite + vega-embed bundle for classic <script> use."""
    Path(path).write_text(vl_convert.javascript_bundle(vl_version=vl_version), encoding="utf-8")
    return path

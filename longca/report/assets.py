"""The static files every report ships: the Vega bundle (generated at build time), our embed script, CSS.

The bundle comes from vl-convert (Vega, Vega-Lite and vega-embed with their dependencies), written
by export.py once per report as assets/vega-bundle.js and loaded by a classic <script>: module scripts and fetch()
do not work from file://, and the report must open from disk with no network.
"""

from __future__ import annotations

from pathlib import Path

import altair as alt
import vl_convert

# Classic script; wrapped so its names cannot collide with the bundle's top-level consts.
EMBED_JS = r"""(function () {
  "use strict";
  function render(div) {
    var holder = document.getElementById(div.getAttribute("data-spec"));
    var spec = JSON.parse(holder.textContent);
    var opts = {renderer: "svg", actions: {export: true, source: false, compiled: false, editor: false}};
    return vegaEmbed(div.querySelector(".vis"), spec, opts).then(function () {
      div.setAttribute("data-rendered", "1");
    }).catch(function (err) {
      div.setAttribute("data-rendered", "error");
      div.querySelector(".vis").textContent = "This chart failed to render: " + err;
      console.error("chart " + div.id + " failed:", err);
    });
  }
  document.addEventListener("DOMContentLoaded", function () {
    var charts = Array.prototype.slice.call(document.querySelectorAll("div.chart[data-spec]"));
    Promise.all(charts.map(render)).then(function () {
      document.body.setAttribute("data-charts-done", String(charts.length));
    });
  });
})();
"""

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #222; }
header { background: #1f2933; color: #fff; padding: .6em 1.2em; }
header a { color: #cde; margin-right: 1em; text-decoration: none; }
header a.here { color: #fff; font-weight: bold; }
header .title { font-size: 1.2em; font-weight: bold; margin-right: 2em; }
main { padding: 1em 1.5em; max-width: 1400px; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
.chart { margin: 1em 0 2em; }
.chart .caption, .note { color: #555; font-size: .9em; max-width: 60em; }
.chart .files a { margin-right: .8em; font-size: .85em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0 1.5em; }
th, td { border: 1px solid #ddd; padding: .25em .5em; text-align: left; vertical-align: top; }
th { background: #f3f4f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.st-supported { background: #e8f5e9; } td.st-unsupported { background: #eeeeee; }
td.st-OOM, td.st-OOM-at-some-sizes { background: #fff3e0; } td.st-failed { background: #ffebee; }
td.st-partly-unsupported { background: #fffde7; }
pre { background: #f6f8fa; padding: .8em; overflow-x: auto; font-size: .85em; }
.gallery figure { display: inline-block; margin: .5em; text-align: center; }
.gallery img { max-width: 220px; border: 1px solid #ddd; }
"""


def vl_version() -> str:
    """The Vega-Lite version Altair writes specs for, as vl-convert names it (e.g. '6.4')."""
    want = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    have = vl_convert.get_vegalite_versions()
    return want if want in have else have[-1]


def write(out: Path) -> dict[str, str]:
    """Write our script and CSS under out/assets (export writes the bundle); returns library versions."""
    d = out / "assets"
    d.mkdir(parents=True, exist_ok=True)
    (d / "report.js").write_text(EMBED_JS, encoding="utf-8")
    (d / "style.css").write_text(CSS, encoding="utf-8")
    return {"vega": vl_convert.get_vega_version(), "vega-lite": vl_version(),
            "vega-embed": vl_convert.get_vega_embed_version(), "altair": alt.__version__,
            "vl-convert": vl_convert.__version__}

"""The static files every report ships: the Vega bundle (generated at build time), the charts' rows
(data.js), our embed script, CSS.

The bundle comes from vl-convert (Vega, Vega-Lite and vega-embed with their dependencies), written
by export.py once per report as assets/vega-bundle.js and loaded by a classic <script>: module scripts and fetch()
do not work from file://, and the report must open from disk with no network. The rows every chart
draws are in one assets/data.js for the whole report (a page's specs carry none), column by column
with repeated values stored once, which the embed script turns back into the spec's dataset.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import altair as alt
import vl_convert

from longca.report.pages import script_json

# A column whose distinct values are at most this share of its rows is stored as a dictionary.
DICTIONARY_SHARE = 0.5

# Classic script; wrapped so its names cannot collide with the bundle's top-level consts.
EMBED_JS = r"""(function () {
  "use strict";
  // data.js stores each chart's rows column by column (longca.report.assets.encode_rows)
  function decode(enc) {
    var rows = [], i;
    for (i = 0; i < enc.n; i++) rows.push({});
    Object.keys(enc.c).forEach(function (name) {
      var col = enc.c[name];
      for (var j = 0; j < enc.n; j++) {
        var v = Array.isArray(col) ? col[j] : col.d[col.i[j]];
        if (v !== null) rows[j][name] = v;  // absent, not null: a tooltip lists what the row has
      }
    });
    return rows;
  }
  function csv(rows) {
    var cols = [];
    rows.forEach(function (r) { Object.keys(r).forEach(function (k) { if (cols.indexOf(k) < 0) cols.push(k); }); });
    var cell = function (v) {
      if (v === undefined || v === null) return "";
      var s = typeof v === "object" ? JSON.stringify(v) : String(v);
      return /[",\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
    };
    return [cols.join(",")].concat(rows.map(function (r) {
      return cols.map(function (k) { return cell(r[k]); }).join(",");
    })).join("\n") + "\n";
  }
  // Downloads made here from the drawn chart and its rows: no file to go missing, works from file://
  function links(div, view, spec, name) {
    var files = div.querySelector(".files");
    if (!files) return;
    var add = function (label, ext, make) {
      var a = document.createElement("a");
      a.textContent = label;
      a.href = "#";
      a.setAttribute("download", name + "." + ext);
      a.addEventListener("click", function (ev) {
        if (a.getAttribute("data-ready")) return;
        ev.preventDefault();
        Promise.resolve(make()).then(function (url) {
          a.href = url;
          a.setAttribute("data-ready", "1");
          a.click();
        });
      });
      files.appendChild(a);
    };
    var blob = function (text, type) { return URL.createObjectURL(new Blob([text], {type: type})); };
    add("SVG", "svg", function () { return view.toImageURL("svg"); });
    add("PNG", "png", function () { return view.toImageURL("png", 2); });
    add("data (CSV)", "csv", function () { return blob(csv(spec.datasets.rows), "text/csv"); });
    add("Vega-Lite spec", "vl.json", function () { return blob(JSON.stringify(spec, null, 1), "application/json"); });
  }
  function render(div) {
    var holder = document.getElementById(div.getAttribute("data-spec"));
    var spec = JSON.parse(holder.textContent);
    var id = div.id.replace(/^chart-/, "");
    spec.datasets = {rows: decode(window.LONGCA_DATA[id])};
    var opts = {renderer: "svg", actions: {export: true, source: false, compiled: false, editor: false}};
    return vegaEmbed(div.querySelector(".vis"), spec, opts).then(function (result) {
      links(div, result.view, spec, id);
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
header { background: #1f2933; color: #fff; padding: .6em 1.2em; display: flex; align-items: baseline;
  white-space: nowrap; overflow-x: auto; }
header a { color: #cde; margin-right: 1em; text-decoration: none; }
header a.here { color: #fff; font-weight: bold; }
header .title { font-size: 1.2em; font-weight: bold; margin-right: 2em; }
main { padding: 1em 1.5em; max-width: 1400px; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
.chart { margin: 1em 0 2em; }
/* a chart's dropdowns above it, not under a tall chart */
.vega-embed .chart-wrapper { display: flex; flex-direction: column; align-items: flex-start; }
.vega-embed .vega-bindings { order: -1; margin: 0 0 .6em; }
.vega-bind { display: inline-block; margin-right: 1.4em; font-weight: 600; }
.chart .caption, .note { color: #555; font-size: .9em; max-width: 60em; }
.chart .files a { margin-right: .8em; font-size: .85em; cursor: pointer; }
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


def encode_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A chart's rows column by column: {"n": rows, "c": {column: values | {"d": distinct, "i": index}}},
    a missing key as null; a column with few distinct values as a dictionary. The embed script's
    `decode` is the inverse (tests/report/test_assets.py checks the round trip)."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    cols: dict[str, Any] = {}
    for name in names:
        values = [r.get(name) for r in rows]
        keys = [json.dumps(v, sort_keys=True) for v in values]
        distinct = list(dict.fromkeys(keys))
        if len(distinct) <= DICTIONARY_SHARE * len(values):
            where = {k: i for i, k in enumerate(distinct)}
            cols[name] = {"d": [json.loads(k) for k in distinct], "i": [where[k] for k in keys]}
        else:
            cols[name] = values
    return {"n": len(rows), "c": cols}


def data_js(specs: dict[str, dict[str, Any]]) -> str:
    """assets/data.js: every chart's rows, by chart id, as one classic script."""
    data = {cid: encode_rows(spec["datasets"]["rows"]) for cid, spec in specs.items()}
    return f"window.LONGCA_DATA = {script_json(data)};\n"


def write(out: Path) -> dict[str, str]:
    """Write our script and CSS under out/assets (export writes the bundle); returns library versions."""
    d = out / "assets"
    d.mkdir(parents=True, exist_ok=True)
    (d / "report.js").write_text(EMBED_JS, encoding="utf-8")
    (d / "style.css").write_text(CSS, encoding="utf-8")
    return {
        "vega": vl_convert.get_vega_version(),
        "vega-lite": vl_version(),
        "vega-embed": vl_convert.get_vega_embed_version(),
        "altair": alt.__version__,
        "vl-convert": vl_convert.__version__,
    }

"""HTML pages: a page is a list of blocks (headings, text, charts, tables) rendered by one Jinja template.

Autoescape is on, so every string from a spec or a row is escaped. Chart specs sit in
<script type="application/json"> blocks, where HTML entities are not decoded; there the JSON itself
escapes <, > and & so no row text can close the script element. A page's specs carry no rows: every
chart's rows are in the report's one assets/data.js (longca.report.assets.data_js), loaded by a
classic script tag, so no data is inlined twice and the pages still open from file://.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from longca.report.charts import ChartSpec


@dataclass
class Table:
    columns: list[str]
    rows: list[list[Any]]
    cell_class: list[list[str]] | None = None  # optional per-cell CSS class
    numeric: set[str] = field(default_factory=set)
    # optional last column: per row, (summary, table) shown on demand in a <details> element
    details: list[tuple[str, Table]] | None = None
    details_column: str = "details"


@dataclass
class Page:
    file: str
    nav: str  # label in the navigation bar
    title: str
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def h2(self, text: str) -> None:
        self.blocks.append(("h2", text))

    def p(self, text: str, cls: str = "") -> None:
        self.blocks.append(("p", (text, cls)))

    def chart(self, c: ChartSpec | None, missing: str) -> None:
        self.blocks.append(("chart", c) if c is not None else ("p", (missing, "note")))

    def table(self, t: Table) -> None:
        self.blocks.append(("table", t))

    def pre(self, text: str) -> None:
        self.blocks.append(("pre", text))

    def links(self, items: list[tuple[str, str]]) -> None:
        self.blocks.append(("links", items))

    def gallery(self, items: list[tuple[str, str]]) -> None:
        self.blocks.append(("gallery", items))

    def charts(self) -> list[ChartSpec]:
        return [b for k, b in self.blocks if k == "chart"]

    def has_content(self) -> bool:
        """Whether the page shows anything beyond notes: a chart, a table, a gallery or code."""
        return any(k in ("chart", "table", "gallery", "pre", "links") for k, _ in self.blocks)


def script_json(obj: Any) -> Markup:
    """JSON safe inside a <script> element: no '<', '>' or '&' survives literally."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Markup(text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


TABLE_MACRO = """{% macro table(b) %}<table><thead><tr>{% for c in b.columns %}<th>{{ c }}</th>{% endfor %}{% if b.details %}<th>{{ b.details_column }}</th>{% endif %}</tr></thead><tbody>
{% for r in b.rows %}{% set i = loop.index0 %}<tr>{% for v in r %}{% set cls = b.cell_class[i][loop.index0] if b.cell_class else "" %}<td{% if cls or b.columns[loop.index0] in b.numeric %} class="{{ cls }}{% if b.columns[loop.index0] in b.numeric %} num{% endif %}"{% endif %}>{{ "" if v is none else v }}</td>{% endfor %}{% if b.details %}<td><details><summary>{{ b.details[i][0] }}</summary>{{ table(b.details[i][1]) }}</details></td>{% endif %}</tr>
{% endfor %}</tbody></table>{% endmacro %}"""

TEMPLATE = (
    TABLE_MACRO
    + """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ page.title }} · {{ site_title }}</title>
<link rel="stylesheet" href="assets/style.css">
{% if page.charts() %}<script src="assets/vega-bundle.js"></script>
<script src="assets/data.js"></script>
<script src="assets/report.js"></script>{% endif %}
</head><body>
<header><span class="title">{{ site_title }}</span>
{% for p in nav %}<a href="{{ p.file }}"{% if p.file == page.file %} class="here"{% endif %}>{{ p.nav }}</a>{% endfor %}
</header>
<main><h1>{{ page.title }}</h1>
{% for kind, b in page.blocks %}
{% if kind == "h2" %}<h2>{{ b }}</h2>
{% elif kind == "p" %}<p{% if b[1] %} class="{{ b[1] }}"{% endif %}>{{ b[0] }}</p>
{% elif kind == "pre" %}<pre>{{ b }}</pre>
{% elif kind == "links" %}<ul>{% for href, text in b %}<li><a href="{{ href }}">{{ text }}</a></li>{% endfor %}</ul>
{% elif kind == "gallery" %}<div class="gallery">{% for src, cap in b %}<figure><img src="{{ src }}" alt="{{ cap }}"><figcaption>{{ cap }}</figcaption></figure>{% endfor %}</div>
{% elif kind == "chart" %}<div class="chart" id="chart-{{ b.id }}" data-spec="spec-{{ b.id }}">
{% if b.id not in headed %}<h3>{{ b.title }}</h3>{% endif %}
<div class="vis"></div>
{% if static_exports %}<noscript><img src="charts/{{ b.id }}.svg" alt="{{ b.title }}"></noscript>{% endif %}
<p class="caption">{{ b.caption }}{% if b.machines %} Measured on: {{ b.machines | join("; ") }}.{% endif %}</p>
<p class="files"></p>
<script type="application/json" id="spec-{{ b.id }}">{{ specs[b.id] }}</script>
</div>
{% elif kind == "table" %}{{ table(b) }}
{% endif %}
{% endfor %}
</main></body></html>
"""
)

_ENV = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_TEMPLATE = _ENV.from_string(TEMPLATE)


def render(page: Page, nav: list[Page], site_title: str, specs: dict[str, dict[str, Any]], static_exports: bool) -> str:
    """One page; `specs` without their rows (the page's script takes them from assets/data.js)."""
    shown = {c.id: script_json({k: v for k, v in specs[c.id].items() if k != "datasets"}) for c in page.charts()}
    # a chart right under a heading of its own gets no second heading
    headed = {b.id for (k0, _), (k, b) in zip(page.blocks, page.blocks[1:]) if k0 == "h2" and k == "chart"}
    return _TEMPLATE.render(
        page=page, nav=nav, site_title=site_title, specs=shown, static_exports=static_exports, headed=headed
    )


def write(
    pages: list[Page],
    out: Path,
    site_title: str,
    specs: dict[str, dict[str, Any]],
    static_exports: bool,
    nav: list[Page] | None = None,
) -> list[Path]:
    """Write `pages` under `out`, each with the navigation bar of `nav` (default: `pages`)."""
    paths = []
    for page in pages:
        path = out / page.file
        path.write_text(render(page, nav or pages, site_title, specs, static_exports), encoding="utf-8")
        paths.append(path)
    return paths

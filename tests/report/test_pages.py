from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from longca.report.pages import Page, Table, render, script_json

HOSTILE = "</script><script>alert(1)</script>&"


def test_script_json_cannot_close_its_element() -> None:
    obj = {"kernel": HOSTILE, "x": [1, 2]}
    text = str(script_json(obj))
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == obj


def test_text_and_tables_are_escaped() -> None:
    page = Page("p.html", "P", HOSTILE)
    page.p(HOSTILE)
    page.pre(HOSTILE)
    page.table(Table(columns=[HOSTILE], rows=[[HOSTILE]]))
    html = render(page, [page], HOSTILE, {}, [])
    assert "<script>alert" not in html
    assert html.count("&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&amp;") >= 5
    # no chart, no scripts at all
    assert "<script" not in html


def test_built_pages_escape_rows_and_spec(site: Path) -> None:
    status = (site / "status.html").read_text()
    assert '<script>alert("x")' not in status
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&amp;amp;" in status
    env = (site / "environment.html").read_text()
    assert "&lt;script&gt;alert(&#34;x&#34;)" in env and '<script>alert("x")' not in env


def test_pages_load_nothing_from_the_network_and_show_no_machine_paths(site: Path) -> None:
    for page in site.glob("*.html"):
        html = page.read_text()
        assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html.replace(
            "https://vega.github.io/schema", ""
        ), page.name
        assert str(site.parent) not in html, page.name  # absolute paths of the build machine


def test_status_page_lists_every_non_ok_row(site: Path, rows_path: Path) -> None:
    rows = pl.read_parquet(rows_path)
    status = (site / "status.html").read_text()
    for reason in rows.filter(pl.col("status") != "ok").get_column("reason").unique().to_list():
        assert reason.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;").split("&amp;")[0][:30] in status

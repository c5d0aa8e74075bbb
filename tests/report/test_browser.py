"""The built site in a real headless Chromium: no console errors, every chart drawn, an overview screenshot."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from report_cdp import CHROMIUM, Browser, load_page

# skipped only where chromium is absent and CI has not said it must be there (.ci/run sets the variable)
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("LONGCA_REQUIRE_CHROMIUM"),
    reason=f"{CHROMIUM} missing (apt-get install chromium)",
)


def test_every_page_loads_and_renders(site: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    charts = set(json.loads((site / "build.json").read_text())["charts"])
    shot = tmp_path_factory.mktemp("screenshots") / "overview.png"
    browser = Browser()
    seen: set[str] = set()
    try:
        for page in sorted(site.glob("*.html")):
            result = load_page(browser, page, screenshot=shot if page.name == "index.html" else None)
            assert result["ready"] == "complete", page.name
            assert result["errors"] == [], (page.name, result["errors"])
            for chart in result["charts"]:
                assert chart["rendered"] == "1", (page.name, chart)
                assert chart["svg"] >= 1 and chart["marks"] > 0, (page.name, chart)
                # downloads made in the page from the drawn chart and its rows (none can point to a missing file)
                name = chart["id"].removeprefix("chart-")
                assert chart["downloads"] == [f"{name}.{ext}" for ext in ("svg", "png", "csv", "vl.json")], chart
                seen.add(chart["id"].removeprefix("chart-"))
    finally:
        browser.close()
    assert seen == charts
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    keep = Path(__file__).resolve().parents[2] / "reports" / "test-overview.png"
    shutil.copyfile(shot, keep)  # reports/ is ignored by git: a place to look at it after CI
    print(f"overview screenshot: {shot} (copy: {keep})")

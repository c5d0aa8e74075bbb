"""The committed reports: every link and image of every page points to a file that is there."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPORTS = Path(__file__).resolve().parents[2] / "reports"
PAGES = sorted(REPORTS.rglob("*.html"))


def local_targets(page: Path) -> list[str]:
    """href/src values of a page that name a file beside it (not a web address, an anchor or a
    download made in the page)."""
    html = page.read_text(encoding="utf-8")
    found = re.findall(r"""(?:href|src)\s*=\s*["']([^"']+)["']""", html)
    out = []
    for target in found:
        parts = urlsplit(target)
        if parts.scheme or target.startswith(("#", "//", "data:", "blob:", "mailto:")):
            continue
        out.append(unquote(parts.path))
    return out


def test_there_are_published_pages():
    assert PAGES, f"no pages under {REPORTS}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPORTS)) for p in PAGES])
def test_no_link_points_to_a_missing_file(page: Path):
    missing = [t for t in local_targets(page) if t and not (page.parent / t).exists()]
    assert not missing, missing


def test_chart_links_to_mask_pages_exist():
    # the choose page's squares link to mask pages through the chart's rows (assets/data.js)
    seen = set()
    for data in REPORTS.rglob("assets/data.js"):
        pages = set(re.findall(r'"(mask-[a-z0-9_\-]+\.html|sparse\.html)"', data.read_text(encoding="utf-8")))
        assert all((data.parent.parent / p).is_file() for p in pages), pages
        seen |= pages
    assert seen  # the published report has a choose page whose squares link somewhere

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
    keep.parent.mkdir(exist_ok=True)  # reports/*.png is ignored by git: a place to look at it after CI
    shutil.copyfile(shot, keep)
    print(f"overview screenshot: {shot} (copy: {keep})")


# the Choose chart's square labels, the time buttons' "eager" clicked, and the labels again
_SWITCH_TO_EAGER = """(async () => {
  const d = document.getElementById('chart-choose');
  const labels = () => Array.from(d.querySelectorAll('svg text')).map(t => t.textContent).join('|');
  const before = labels();
  const eager = d.querySelector('input[type=radio][value=eager]');
  if (!eager) return JSON.stringify({buttons: false});
  eager.click();
  await new Promise(r => setTimeout(r, 1500));
  return JSON.stringify({buttons: true, before: before, after: labels()});
})()"""


def test_the_choose_pages_time_buttons_rank_again_at_eager_time(site: Path) -> None:
    # the fixture's flex cells at 1K are replayed at 0.4 of their eager time: at kernel time (the
    # default) flex leads squares at 1K that fa_fixture leads at eager time
    browser = Browser()
    try:
        result = load_page(browser, site / "index.html", script=_SWITCH_TO_EAGER)
    finally:
        browser.close()
    assert result["errors"] == []
    got = json.loads(result["script"])
    assert got["buttons"], "no time buttons on the Choose page"
    assert got["before"] != got["after"]
    assert got["before"].count("flex") > got["after"].count("flex")


def test_the_tooltip_repro_command_is_the_one_longca_repro_prints() -> None:
    """The charts' Vega expression (valid JavaScript) gives, for a drawn row, the exact command of
    longca.report.repro.repro_command: evaluated here in Chromium, single-device and CP rows."""
    from longca.report.repro import repro_command, repro_expression

    rows = [
        {
            "spec": "h200",
            "sweep": "dense",
            "kernel": "fa4",
            "mask": "causal",
            "mask_variant": "default",
            "seqlen_q": 32768,
            "heads_q": 64,
            "heads_kv": 8,
            "head_dim": 128,
            "dtype": "bfloat16",
            "pass": "bwd",
            "batch": 1,
        },
        {
            "spec": "h200-cp",
            "sweep": "cp_goal",
            "kernel": "sdpa_cudnn",
            "mask": "full",
            "mask_variant": "default",
            "seqlen_q": 65536,
            "heads_q": 64,
            "heads_kv": 8,
            "head_dim": 128,
            "dtype": "bfloat16",
            "pass": "fwd",
            "batch": 1,
            "cp_mechanism": "ring_p2p",
            "world_size": 2,
            "cp_variant": "zigzag",
        },
    ]
    browser = Browser()
    try:
        target = browser.send("Target.createTarget", url="about:blank")["targetId"]
        session = browser.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for row in rows:
            expr = f"(function (datum) {{ return {repro_expression()}; }})({json.dumps(row)})"
            got = browser.send("Runtime.evaluate", session, expression=expr)["result"]["value"]
            assert got == repro_command(row)
        peer = f"(function (datum) {{ return {repro_expression()}; }})({{}})"
        assert browser.send("Runtime.evaluate", session, expression=peer)["result"].get("value") is None
    finally:
        browser.close()

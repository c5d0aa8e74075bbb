"""Shared fixtures: the synthetic rows (test fixtures, see report_rows.py) and one report built from them.

The report is built once per session through the `longca report` command, so the command, the build
and the browser test all look at the same pages.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # sibling helper modules (pytest runs in importlib mode)

from report_rows import HOSTILE, synthetic_table  # noqa: E402

from longca.cli import main


@pytest.fixture(scope="session")
def rows_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rows") / "all.parquet"
    pq.write_table(synthetic_table(), path)
    return path


@pytest.fixture(scope="session")
def spec_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "fixture.yaml"
    path.write_text(f"name: fixture\n# {HOSTILE}\nkernels: [sdpa, flex]\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory, rows_path: Path, spec_path: Path) -> Path:
    out = tmp_path_factory.mktemp("report") / "fixture"
    assert main(["report", "--data", str(rows_path), "--spec", str(spec_path), "--out", str(out)]) == 0
    return out

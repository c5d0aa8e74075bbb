"""Shared fixtures: the synthetic rows (test fixtures, see report_rows.py) and one report built from them.

The report is built once per session through the `longca report` command, so the command, the build
and the browser test all look at the same pages.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
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
def reruns_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An earlier run of every synthetic row: another run id, every median 2% longer."""
    import pyarrow.compute as pc

    table = synthetic_table()
    table = table.set_column(table.schema.get_field_index("run_id"), "run_id", pa.array(["run-before"] * len(table)))
    i = table.schema.get_field_index("median_ms")
    table = table.set_column(i, "median_ms", pc.multiply(table["median_ms"], 1.02))
    path = tmp_path_factory.mktemp("reruns") / "reruns.parquet"
    pq.write_table(table, path)
    return path


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory, rows_path: Path, spec_path: Path, reruns_path: Path) -> Path:
    out = tmp_path_factory.mktemp("report") / "fixture"
    args = ["report", "--data", str(rows_path), "--spec", str(spec_path), "--out", str(out)]
    assert main([*args, "--reruns", str(reruns_path)]) == 0
    return out

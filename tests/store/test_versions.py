"""Result files of an older schema_version read, aggregate and unpack together with current ones."""

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_rows import store_row

from longca.report.load import read_rows
from longca.store.aggregate import aggregate, unpack
from longca.store.read import damage
from longca.store.schema import SCHEMA, SCHEMA_VERSION
from longca.store.write import write_rows

NEW_IN_2 = ("check_s", "timer_wall_s", "warmup_s")
NEW_IN_3 = ("cooldown_s",)
NEW_IN_4 = ("ci_low_ms", "ci_high_ms", "ci_target", "ci_met")
NEW_IN_5 = ("clock_window_mhz", "clock_window_min_mhz", "throttle_window", "graph_median_ms", "graph_reason")
NEW_IN_6 = ("agree_kernel", "agree_rel_diff", "agree_reason")
NEW_IN_7 = ("agree_rel_diff_dq", "agree_rel_diff_dk", "agree_rel_diff_dv")
NEW_IN_8 = ("host_cpu",)
ADDED = {
    2: NEW_IN_2,
    3: NEW_IN_3,
    4: NEW_IN_4,
    5: NEW_IN_5,
    6: NEW_IN_6,
    7: NEW_IN_7,
    8: NEW_IN_8,
}  # columns each schema version added
ROOT = Path(__file__).resolve().parents[2]


def _write_old(path: Path, rows: list[dict], version: int) -> None:
    """A file as schema `version` wrote it: without the columns later versions added."""
    later = {c for v, cols in ADDED.items() if v > version for c in cols}
    old = pa.schema([f for f in SCHEMA if f.name not in later])
    cols = {
        f.name: pa.array([(version if f.name == "schema_version" else r.get(f.name)) for r in rows], type=f.type)
        for f in old
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols, schema=old), path)


@pytest.fixture
def mixed(tmp_path: Path) -> list[str]:
    v1, v2, v3, v4, v5, v6, v7, new = (
        tmp_path / "cells" / f"{n}.parquet" for n in ("v1", "v2", "v3", "v4", "v5", "v6", "v7", "new")
    )
    _write_old(v1, [store_row("a")], 1)
    _write_old(v2, [store_row("c", check_s=0.5, timer_wall_s=1.0, warmup_s=0.25)], 2)
    _write_old(v3, [store_row("d", check_s=0.5, timer_wall_s=1.0, warmup_s=0.25, cooldown_s=1.0)], 3)
    _write_old(v4, [store_row("e", cooldown_s=1.0, ci_low_ms=0.8, ci_high_ms=1.2, ci_target=0.02, ci_met=True)], 4)
    _write_old(
        v5,
        [store_row("f", ci_low_ms=0.8, ci_high_ms=1.2, clock_window_mhz=1900, graph_reason="no CUDA graphs on cpu")],
        5,
    )
    _write_old(v6, [store_row("g", ci_low_ms=0.8, agree_kernel="cudnn_flex", agree_rel_diff=0.002)], 6)
    _write_old(v7, [store_row("h", agree_kernel="fa4", agree_rel_diff_dq=0.001)], 7)
    write_rows(
        new,
        [
            store_row(
                "b",
                check_s=0.25,
                timer_wall_s=0.5,
                warmup_s=0.125,
                cooldown_s=2.0,
                ci_low_ms=0.9,
                ci_high_ms=1.1,
                ci_target=0.01,
                ci_met=False,
                clock_window_mhz=1980,
                clock_window_min_mhz=1755,
                throttle_window="0x4",
                graph_median_ms=0.5,
                graph_reason=None,
                agree_kernel="fa4",
                agree_rel_diff=0.004,
                agree_rel_diff_dq=0.005,
                agree_rel_diff_dk=0.006,
                agree_rel_diff_dv=0.003,
                agree_reason=None,
                host_cpu="Some CPU @ 2.00GHz",
            )
        ],
    )
    return [str(v1), str(v2), str(v3), str(v4), str(v5), str(v6), str(v7), str(new)]


def _by_cell(table: pa.Table) -> dict[str, dict]:
    return {r["cell_id"]: r for r in table.to_pylist()}


def test_aggregating_old_and_new_files_keeps_both(mixed: list[str], tmp_path: Path, union) -> None:
    assert all(damage(f) is None for f in mixed)  # an old file is sound, not damaged
    out = tmp_path / "all.parquet"
    assert union(mixed, out) == 8
    rows = _by_cell(pq.read_table(out))
    assert [rows[c]["schema_version"] for c in "acdefghb"] == [1, 2, 3, 4, 5, 6, 7, SCHEMA_VERSION]
    assert SCHEMA_VERSION == 8
    assert [rows[c]["host_cpu"] for c in "acdefghb"] == [None] * 7 + ["Some CPU @ 2.00GHz"]
    assert (rows["h"]["agree_rel_diff_dq"], rows["h"]["agree_rel_diff"]) == (0.001, None)
    cols = NEW_IN_2 + NEW_IN_3 + NEW_IN_4 + NEW_IN_5 + NEW_IN_6 + NEW_IN_7
    assert [rows["a"][c] for c in cols] == [None] * 19
    assert [rows["c"][c] for c in cols] == [0.5, 1.0, 0.25] + [None] * 16
    assert [rows["d"][c] for c in cols] == [0.5, 1.0, 0.25, 1.0] + [None] * 15
    assert [rows["e"][c] for c in cols] == [None] * 3 + [1.0, 0.8, 1.2, 0.02, True] + [None] * 11
    assert [rows["f"][c] for c in cols] == [None] * 4 + [0.8, 1.2, None, None, 1900, None, None, None] + [
        "no CUDA graphs on cpu"
    ] + [None] * 6
    assert [rows["g"][c] for c in cols] == [None] * 4 + [0.8] + [None] * 8 + ["cudnn_flex", 0.002] + [None] * 4
    assert [rows["b"][c] for c in cols] == [
        0.25,
        0.5,
        0.125,
        2.0,
        0.9,
        1.1,
        0.01,
        False,
        1980,
        1755,
        "0x4",
        0.5,
        None,
        "fa4",
        0.004,
        None,
        0.005,
        0.006,
        0.003,
    ]
    assert pq.read_table(out).schema.equals(SCHEMA, check_metadata=False)  # the current schema, whatever came first


def test_unpacking_a_mixed_aggregate_keeps_each_rows_version(mixed: list[str], tmp_path: Path) -> None:
    out = tmp_path / "all.parquet"
    aggregate(mixed, out)
    assert unpack(out, tmp_path / "results") == (8, 0)
    table, _ = read_rows([tmp_path / "results"])
    rows = _by_cell(table)
    assert (rows["a"]["schema_version"], rows["a"]["check_s"]) == (1, None)
    assert (rows["c"]["schema_version"], rows["c"]["check_s"], rows["c"]["cooldown_s"]) == (2, 0.5, None)
    assert (rows["d"]["schema_version"], rows["d"]["cooldown_s"], rows["d"]["ci_low_ms"]) == (3, 1.0, None)
    assert (rows["e"]["schema_version"], rows["e"]["ci_high_ms"], rows["e"]["clock_window_mhz"]) == (4, 1.2, None)
    assert (rows["f"]["schema_version"], rows["f"]["clock_window_mhz"], rows["f"]["agree_kernel"]) == (5, 1900, None)
    assert (rows["g"]["schema_version"], rows["g"]["agree_kernel"], rows["g"]["agree_rel_diff_dq"]) == (
        6,
        "cudnn_flex",
        None,
    )
    assert (rows["h"]["schema_version"], rows["h"]["agree_rel_diff_dq"], rows["h"]["host_cpu"]) == (7, 0.001, None)
    assert (rows["b"]["schema_version"], rows["b"]["agree_kernel"], rows["b"]["host_cpu"]) == (
        8,
        "fa4",
        "Some CPU @ 2.00GHz",
    )


def test_report_loader_reads_old_and_new_files_together(mixed: list[str]) -> None:
    table, df = read_rows(mixed)
    assert table.schema == SCHEMA
    assert df.sort("cell_id").get_column("timer_wall_s").to_list() == [None, 0.5, 1.0, 1.0, None, None, None, None]
    assert df.sort("cell_id").get_column("cooldown_s").to_list() == [None, 2.0, None, 1.0, 1.0, None, None, None]


def test_committed_results_of_older_schemas_still_read(tmp_path: Path) -> None:
    import pyarrow.compute as pc

    committed = ROOT / "results" / "h200" / "all.parquet"
    if not committed.is_file():
        pytest.skip("no committed results")
    table = pq.read_table(committed)
    # up to 20 committed rows of each older schema the file holds (1 and 2 when this was written)
    versions = sorted(v for v in set(table.column("schema_version").to_pylist()) if v < SCHEMA_VERSION)
    assert versions, "the committed results hold no older-schema rows"
    old = pa.concat_tables([table.filter(pc.equal(table["schema_version"], v)).slice(0, 20) for v in versions])
    pq.write_table(old, tmp_path / "old.parquet")
    write_rows(
        tmp_path / "new.parquet", [store_row("b", check_s=0.0, timer_wall_s=0.5, warmup_s=0.125, cooldown_s=0.0)]
    )
    files = [str(tmp_path / "old.parquet"), str(tmp_path / "new.parquet")]
    assert aggregate(files, tmp_path / "all.parquet") == old.num_rows + 1
    _, df = read_rows([tmp_path / "all.parquet"])
    if 1 in versions:
        assert df.filter(df["schema_version"] == 1).get_column("check_s").null_count() == 20
    before_ci = df.filter(df["schema_version"] < 4)
    assert before_ci.get_column("ci_low_ms").null_count() == before_ci.height
    before_window = df.filter(df["schema_version"] < 5)
    assert before_window.height == sum(v < 5 for v in old.column("schema_version").to_pylist())
    assert before_window.get_column("clock_window_mhz").null_count() == before_window.height
    assert df.filter(df["schema_version"] == SCHEMA_VERSION).get_column("cooldown_s").to_list() == [0.0]

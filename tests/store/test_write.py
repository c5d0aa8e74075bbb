import os
import stat
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from store_rows import store_row

from longca.store.read import damage
from longca.store.schema import COLUMNS, REQUIRED, SCHEMA_VERSION, to_table
from longca.store.write import write_rows, write_table

ROW = store_row("c", samples_ms=[1.0, 1.1], mask_params={"window": 3})


def test_contract_columns_present():
    for col in REQUIRED:
        assert col in COLUMNS


def test_roundtrip_and_version(tmp_path):
    path = tmp_path / "a" / "cell.parquet"
    write_rows(path, [ROW, {**ROW, "status": "oom", "reason": "out of memory"}])
    t = pq.read_table(path)
    assert t.num_rows == 2
    assert t.column("schema_version").to_pylist() == [SCHEMA_VERSION] * 2
    assert t.column("mask_params").to_pylist()[0] == '{"window": 3}'
    assert damage(path) is None
    assert not [p for p in path.parent.iterdir() if p.name != "cell.parquet"], "temporary file left behind"


def test_unknown_column_and_status_rejected():
    with pytest.raises(KeyError, match="outside the schema"):
        to_table([{**ROW, "colour": "red"}])
    with pytest.raises(ValueError, match="status"):
        to_table([{**ROW, "status": "fast"}])


@pytest.mark.parametrize("cut", [0, 5, 100, -8])
def test_truncated_file_is_damaged(tmp_path, cut):
    path = tmp_path / "cell.parquet"
    write_rows(path, [ROW])
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    why = damage(path)
    assert why and str(path) in why


def test_corrupt_footer_is_damaged(tmp_path):
    path = tmp_path / "cell.parquet"
    write_rows(path, [ROW])
    data = bytearray(path.read_bytes())
    data[-20:-8] = b"\xff" * 12  # footer bytes, magic kept
    path.write_bytes(bytes(data))
    assert damage(path) and "cell.parquet" in damage(path)


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "cell.parquet"
    with pytest.raises(ValueError):
        write_rows(path, [{**ROW, "status": "nonsense"}])
    assert list(tmp_path.iterdir()) == []


def test_files_respect_the_umask(tmp_path):
    """A result file is as readable as any new file (0644 under umask 0022), not mkstemp's 0600;
    the umask is the one the process started with (a child process here, with its own umask)."""
    import stat
    import subprocess
    import sys

    for umask, mode in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        path = tmp_path / f"cell-{umask:o}.parquet"
        code = (
            f"import os; os.umask({umask}); from longca.store.write import write_rows, write_table; "
            f"write_rows({str(path)!r}, [{{'kernel': 'k', 'mask': 'full', 'status': 'ok'}}])"
        )
        subprocess.run([sys.executable, "-c", code], check=True)
        assert stat.S_IMODE(path.stat().st_mode) == mode, (oct(umask), oct(path.stat().st_mode))


def test_private_keys_are_not_written_and_parents_are_made(tmp_path):
    path = tmp_path / "a" / "b" / "cell.parquet"
    write_rows(path, [{**ROW, "_progress": 3}])
    assert "_progress" not in pq.read_schema(path).names and damage(path) is None


def test_a_cell_file_is_uncompressed_without_statistics_or_arrow_schema(tmp_path):
    path = tmp_path / "cell.parquet"
    write_rows(path, [ROW])
    meta = pq.read_metadata(path)
    column = meta.row_group(0).column(0)
    assert column.compression == "UNCOMPRESSED" and not column.is_stats_set
    assert b"ARROW:schema" not in (meta.metadata or {})
    assert not any("DICTIONARY" in e for e in column.encodings)


def test_an_aggregate_is_zstd_at_its_level(tmp_path):
    path = tmp_path / "all.parquet"
    table = to_table([ROW] * 3)
    write_table(path, table, level=19)
    meta = pq.read_metadata(path)
    assert meta.row_group(0).column(0).compression == "ZSTD"
    assert pq.read_table(path).num_rows == 3
    # the level reaches the writer: the highest compresses the samples better than the lowest
    low = tmp_path / "low.parquet"
    many = to_table([store_row(f"c{i}", samples_ms=[1.0 + (i * j % 7) / 10 for j in range(200)]) for i in range(50)])
    write_table(low, many, level=1)
    write_table(path, many, level=22)
    assert path.stat().st_size < low.stat().st_size


def test_the_file_is_written_beside_its_target_then_renamed(tmp_path, monkeypatch):
    path = tmp_path / "cell.parquet"
    renamed = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renamed.append((src, dst)), real_replace(src, dst)))
    write_rows(path, [ROW])
    ((src, dst),) = renamed
    assert Path(src).parent == tmp_path and Path(dst) == path
    assert Path(src).name.startswith(".cell.parquet.") and Path(src).name.endswith(".part")


def test_a_write_that_fails_midway_leaves_no_file_and_raises(tmp_path, monkeypatch):
    path = tmp_path / "cell.parquet"

    def broken(table, where, **kwargs):
        where.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        write_rows(path, [ROW])
    assert list(tmp_path.iterdir()) == []


def test_a_file_is_as_readable_as_any_new_file_in_this_process(tmp_path):
    current = os.umask(0o022)
    os.umask(current)
    path = tmp_path / "cell.parquet"
    write_rows(path, [ROW])
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~current

"""Reading results back (longca.store.read): every way a cell file can be damaged is named, a sound
file is not, and the run's summary line counts cells by status."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from store_rows import store_row

from longca.store.read import damage, digest_statuses, run_summary
from longca.store.schema import REQUIRED, to_table
from longca.store.write import write_rows, write_table


@pytest.fixture
def sound(tmp_path):
    path = tmp_path / "cell.parquet"
    write_rows(path, [store_row("c1")])
    return path


def test_a_sound_file_has_no_damage(sound):
    assert damage(sound) is None


def test_a_missing_file(tmp_path):
    assert damage(tmp_path / "none.parquet").endswith("none.parquet: missing")


@pytest.mark.parametrize("keep", [0, 4, 11])
def test_a_file_under_12_bytes_is_truncated(sound, keep):
    sound.write_bytes(sound.read_bytes()[:keep])
    assert damage(sound).endswith(f"truncated ({keep} bytes)")


def test_a_file_cut_short_has_no_closing_magic(sound):
    data = sound.read_bytes()
    sound.write_bytes(data[: len(data) // 2])
    assert "bad magic bytes" in damage(sound)


def test_an_overwritten_header_with_an_intact_footer_is_damaged(sound):
    data = bytearray(sound.read_bytes())
    data[:4] = b"XXXX"
    sound.write_bytes(bytes(data))
    assert "bad magic bytes" in damage(sound)


def test_a_corrupt_footer_with_intact_magic_is_unreadable(sound):
    data = bytearray(sound.read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    data[start : len(data) - 8] = b"\xff" * footer_len
    sound.write_bytes(bytes(data))
    assert "unreadable Parquet" in damage(sound)


def test_a_file_of_12_bytes_with_both_magics_is_unreadable_not_truncated(tmp_path):
    path = tmp_path / "tiny.parquet"
    path.write_bytes(b"PAR1\x00\x00\x00\x00\x00PAR1"[:4] + b"\x00\x00\x00\x00" + b"PAR1")
    assert "unreadable Parquet" in damage(path)


def test_a_file_without_rows_is_damaged(tmp_path):
    path = tmp_path / "empty.parquet"
    table = pa.table({c: pa.array([], pa.string()) for c in REQUIRED})
    write_table(path, table)
    assert damage(path).endswith("holds no rows")


def test_a_file_lacking_a_required_column_names_it(tmp_path):
    table = to_table([store_row("c1")])
    for dropped in (REQUIRED[0], REQUIRED[-1]):
        path = tmp_path / f"no-{dropped}.parquet"
        pq.write_table(table.drop_columns([dropped]), path)
        assert damage(path).endswith(f"missing columns {[dropped]}")


def test_digest_statuses_reads_both_columns_or_says_which_is_absent(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"cell_digest": ["a", "b"], "status": ["ok", None], "x": [1, 2]}), path)
    assert digest_statuses(path) == (["a", "b"], ["ok", None])
    pq.write_table(pa.table({"cell_digest": ["a"], "x": [1]}), path)
    assert digest_statuses(path) == (["a"], None)
    pq.write_table(pa.table({"status": ["ok"]}), path)
    with pytest.raises(KeyError, match="no cell_digest column"):
        digest_statuses(path)


def test_run_summary_counts_cells_by_their_least_status_most_first(tmp_path):
    path = tmp_path / "all.parquet"
    digests = ["a", "a", "b", "c", "d", "d", "e"]
    statuses = ["ok", "ok", "oom", "ok", "error", "ok", "ok"]  # d: "error" < "ok"
    pq.write_table(pa.table({"cell_digest": digests, "status": statuses}), path)
    # most first; equal counts keep their first appearance
    assert run_summary(path) == f"longca: 5 cells (3 ok, 1 oom, 1 error), 7 rows in {path}"
    assert run_summary(path, "reports/t/index.html").endswith(
        "7 rows in " + str(path) + "; report: reports/t/index.html"
    )


def test_damage_reads_the_magic_at_both_ends_exactly(sound):
    data = bytearray(sound.read_bytes())
    data[-5] = ord("X")  # the byte before the closing magic: the footer length, not the magic
    sound.write_bytes(bytes(data))
    assert "bad magic bytes" not in (damage(sound) or "")
    data = bytearray(sound.read_bytes())
    data[-1:] = b"X"
    sound.write_bytes(bytes(data))
    assert "bad magic bytes" in damage(sound)


def test_an_unreadable_file_names_the_parse_error(sound):
    data = bytearray(sound.read_bytes())
    data[-8:-4] = (10**9).to_bytes(4, "little")  # a footer longer than the file
    sound.write_bytes(bytes(data))
    why = damage(sound)
    assert why.startswith(f"{sound}: unreadable Parquet (ArrowInvalid: Parquet file size is ")


def test_digest_statuses_and_run_summary_read_their_two_columns_only(tmp_path, monkeypatch):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"cell_digest": ["a"], "status": ["ok"], "x": [1]}), path)
    asked = []
    real = pq.read_table
    monkeypatch.setattr(
        pq, "read_table", lambda p, columns=None, **kw: (asked.append(columns), real(p, columns=columns))[1]
    )
    digest_statuses(path)
    run_summary(path)
    assert asked == [["cell_digest", "status"], ["cell_digest", "status"]]

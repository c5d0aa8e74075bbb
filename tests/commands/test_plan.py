"""`longca plan`: what is still to run, per sweep and kernel, before any device is touched."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longca.cli import main
from longca.run.cell import status_row
from longca.run.serving import planned_unsupported
from longca.spec.cells import expand
from longca.spec.load import load_spec
from longca.store.write import write_rows

SPEC = "specs/default.yaml"


def _table_rows(out: str) -> dict[tuple[str, str, str], tuple[int, int, int, int]]:
    lines = out.strip().splitlines()
    assert lines[1].split()[:5] == ["sweep", "kernel", "cp", "cells", "done"]
    return {(p[0], p[1], p[2]): tuple(map(int, p[3:7])) for p in (line.split() for line in lines[2:])}


def test_an_empty_results_folder_leaves_every_cell_to_run(tmp_path: Path, capsys) -> None:
    cells = expand(load_spec(SPEC))
    assert main(["plan", SPEC, "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"spec default: {len(cells)} cells in ") and f"; {len(cells)} to run in " in out
    table = _table_rows(out)
    assert sum(n[0] for n in table.values()) == len(cells)
    assert ("cp", "naive", "ring_p2p") in table  # a CP sweep's rows name the mechanism
    for (sweep, kernel, cp), (total, done, todo, planned) in table.items():
        mine = [c for c in cells if c.sweep == sweep and c.kernel == kernel and (c.cp_mechanism or "-") == cp]
        assert (total, done, todo) == (len(mine), 0, len(mine))
        # planned unsupported: the single-GPU cells the capabilities rule out before any device
        assert planned == sum(1 for c in mine if c.cp_mechanism is None and planned_unsupported(c))
    assert any(n[3] for n in table.values())  # the default spec has such cells


def test_rows_of_an_aggregate_count_as_done_and_the_selection_narrows(tmp_path: Path, capsys) -> None:
    cells = [c for c in expand(load_spec(SPEC)) if c.sweep == "dense" and c.kernel == "naive"]
    agg = tmp_path / "all.parquet"
    pq.write_table(pa.table({"cell_digest": [c.digest for c in cells[:5]]}), agg)
    assert (
        main(
            [
                "plan",
                SPEC,
                "--results",
                str(tmp_path / "none"),
                "--rows",
                str(agg),
                "--sweep",
                "dense",
                "--only",
                "kernel=naive",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"({len(cells)} selected); {len(cells) - 5} to run" in out
    assert _table_rows(out) == {("dense", "naive", "-"): (len(cells), 5, len(cells) - 5, 0)}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sweep", "dens"], "--sweep 'dens': no such sweep in 'default'; allowed: cp, dense, shapes, sparse"),
        (["--only", "kernel=cudnn"], "--only kernel=cudnn: no cell of the selected sweeps has it; allowed: "),
    ],
)
def test_a_selection_matching_no_cell_names_the_allowed_values(tmp_path: Path, capsys, args, message) -> None:
    assert main(["plan", SPEC, "--results", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err


def test_done_cells_refused_although_the_capabilities_allow_them_are_named(tmp_path: Path, capsys) -> None:
    # A cell recorded `unsupported` is never planned again by itself; when the kernel's capabilities
    # no longer rule it out (they grew, or a run refused it), plan says so and how to retry it.
    cells = [c for c in expand(load_spec(SPEC)) if c.sweep == "dense" and c.kernel == "naive"]
    assert not any(planned_unsupported(c) for c in cells[:3])
    agg = tmp_path / "all.parquet"
    statuses = ["unsupported", "unsupported", "ok", "ok"]
    pq.write_table(pa.table({"cell_digest": [c.digest for c in cells[:4]], "status": statuses}), agg)
    args = ["plan", SPEC, "--results", str(tmp_path / "none"), "--rows", str(agg), "--sweep", "dense"]
    assert main([*args, "--only", "kernel=naive"]) == 0
    out = capsys.readouterr().out
    assert "2 done cells are recorded `unsupported` although the kernels' capabilities do not rule them out now" in out
    assert "naive 2; `longca run --retry unsupported` with a selection measures them again" in out
    # nothing refused: no such line
    pq.write_table(pa.table({"cell_digest": [c.digest for c in cells[:4]], "status": ["ok"] * 4}), agg)
    assert main([*args, "--only", "kernel=naive"]) == 0
    assert "recorded `unsupported`" not in capsys.readouterr().out
    # the same from the cell files of a results folder
    write_rows(cells[0].output(tmp_path / "res"), [status_row(cells[0], "unsupported", "an older capability")])
    assert main(["plan", SPEC, "--results", str(tmp_path / "res"), "--sweep", "dense", "--only", "kernel=naive"]) == 0
    assert "1 done cells are recorded `unsupported`" in capsys.readouterr().out


def test_cells_with_draws_kept_from_a_stopped_run_are_counted(tmp_path: Path, capsys) -> None:
    from longca.store.draws import save_draw

    cells = [c for c in expand(load_spec(SPEC)) if c.sweep == "dense" and c.kernel == "naive"]
    res = tmp_path / "res"
    args = ["plan", SPEC, "--results", str(res), "--sweep", "dense", "--only", "kernel=naive"]
    assert main(args) == 0
    assert "draws kept" not in capsys.readouterr().out
    for sample in (0, 1):  # two draws of one cell, one of another
        save_draw(cells[0].output(res), sample, status_row(cells[0], "ok", None))
    save_draw(cells[1].output(res), 0, status_row(cells[1], "ok", None))
    write_rows(cells[1].output(res), [status_row(cells[1], "ok", None)])  # written: no longer to run
    assert main(args) == 0
    assert "1 of the cells to run have 2 draws kept from a run stopped inside them" in capsys.readouterr().out


def test_rows_out_writes_only_the_rows_of_the_selected_current_cells(tmp_path: Path, capsys) -> None:
    # What a size-capped device call carries: the rows of the cells it selects, never a superseded
    # digest's rows nor another selection's, with every column kept.
    cells = [c for c in expand(load_spec(SPEC)) if c.sweep == "dense"]
    naive = [c for c in cells if c.kernel == "naive"][:3]
    other = next(c for c in cells if c.kernel != "naive")
    digests = [naive[0].digest, naive[0].digest, naive[1].digest, other.digest, "0123456789abcdef"]
    agg = tmp_path / "all.parquet"
    pq.write_table(pa.table({"cell_digest": digests, "median_ms": [1.0, 2.0, 3.0, 4.0, 5.0]}), agg)
    out = tmp_path / "carry" / "all.parquet"
    args = ["plan", SPEC, "--results", str(tmp_path / "none"), "--rows", str(agg), "--sweep", "dense"]
    assert main([*args, "--only", "kernel=naive", "--rows-out", str(out)]) == 0
    assert f"{out}: 3 rows of the selected cells from {agg}" in capsys.readouterr().out
    carried = pq.read_table(out).to_pydict()
    assert carried == {"cell_digest": digests[:3], "median_ms": [1.0, 2.0, 3.0]}


def test_rows_out_takes_a_cell_held_by_two_aggregates_from_the_last_one(tmp_path: Path, capsys) -> None:
    # A call continuing a selection carries the committed rows and the previous call's aggregate,
    # which holds the cells the first call carried: each cell's rows must travel once, or the
    # unpacked cell file and every aggregate after it hold them twice.
    naive = [c for c in expand(load_spec(SPEC)) if c.sweep == "dense" and c.kernel == "naive"][:3]
    a, b = naive[0].digest, naive[1].digest
    published, call = tmp_path / "published.parquet", tmp_path / "call.parquet"
    pq.write_table(pa.table({"cell_digest": [a, a, b], "median_ms": [1.0, 1.5, 2.0]}), published)
    pq.write_table(pa.table({"cell_digest": [b, naive[2].digest], "median_ms": [2.5, 3.0]}), call)
    out = tmp_path / "carry.parquet"
    args = ["plan", SPEC, "--results", str(tmp_path / "none"), "--sweep", "dense", "--only", "kernel=naive"]
    assert main([*args, "--rows", str(published), "--rows", str(call), "--rows-out", str(out)]) == 0
    assert f"{out}: 4 rows of the selected cells" in capsys.readouterr().out
    carried = pq.read_table(out).to_pydict()
    assert sorted(zip(carried["cell_digest"], carried["median_ms"])) == sorted(
        [(a, 1.0), (a, 1.5), (b, 2.5), (naive[2].digest, 3.0)]
    )


def test_rows_out_and_superseded_out_split_an_aggregate_into_its_current_set_and_the_rest(
    tmp_path: Path, capsys
) -> None:
    # When a re-measure is complete, the published aggregate becomes its current set, and the rows
    # of digests the spec no longer has go to a file of their own, every row in exactly one of them.
    cells = expand(load_spec(SPEC))
    digests = [cells[0].digest, cells[0].digest, cells[5].digest, "0123456789abcdef", None]
    agg = tmp_path / "all.parquet"
    pq.write_table(pa.table({"cell_digest": digests, "median_ms": [1.0, 2.0, 3.0, 4.0, 5.0]}), agg)
    current, rest = tmp_path / "current.parquet", tmp_path / "superseded.parquet"
    args = ["plan", SPEC, "--results", str(tmp_path / "none"), "--rows", str(agg)]
    assert main([*args, "--rows-out", str(current), "--superseded-out", str(rest)]) == 0
    out = capsys.readouterr().out
    assert f"{current}: 3 rows of the selected cells" in out
    assert f"{rest}: 2 rows of digests the spec no longer has from {agg}" in out
    assert pq.read_table(current).to_pydict() == {"cell_digest": digests[:3], "median_ms": [1.0, 2.0, 3.0]}
    assert pq.read_table(rest).to_pydict() == {"cell_digest": digests[3:], "median_ms": [4.0, 5.0]}

"""tools/sweep_projection.py: calls per row from the budget and cap, overheads added as declared."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sweep_projection", ROOT / "tools" / "sweep_projection.py")
sp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sp)


def test_calls_are_bounded_by_the_budget_the_cap_and_the_minimum() -> None:
    # 1 ms calls: the 1 s budget allows 1000, the cap 200 -> 0.2 s timed; no overheads
    assert sp.project([1.0], 1.0, 200, per_row_s=0, per_call_ms=0, fixed_s=0) == pytest.approx((1.0, 0.2))
    # 500 ms calls: the budget allows 2, the minimum makes it 10 -> 5 s timed
    assert sp.project([500.0], 1.0, 200, per_row_s=0, per_call_ms=0, fixed_s=0) == pytest.approx((1.0, 5.0))


def test_overheads_lower_the_share_as_declared() -> None:
    # 2 rows of 10 ms under 1 s: 100 calls each, 1 s timed each; per row 0.5 s, per call 1 ms, fixed 1 s
    share, wall = sp.project([10.0, 10.0], 1.0, 1000, per_row_s=0.5, per_call_ms=1.0, fixed_s=1.0)
    assert wall == pytest.approx(2.0 + 0.2 + 1.0 + 1.0)
    assert share == pytest.approx(2.0 / wall)


def _rows_of(path: Path, cell_id: str, cell, median_ms: float = 2.0) -> Path:
    """One ok row per mask draw of `cell`, recorded under `cell_id` (its current id or an older one)."""
    from longca.store.write import write_rows

    rows = [
        {
            "spec": cell.spec,
            "sweep": cell.sweep,
            "cell_id": cell_id,
            "cell_digest": cell_id.rsplit("@", 1)[1],
            "kernel": "naive",
            "mask": "full",
            "pass": cell.pass_,
            "seqlen_q": cell.seqlen,
            "seqlen_k": cell.seqlen,
            "batch": 1,
            "heads_q": 4,
            "heads_kv": 4,
            "head_dim": 32,
            "dtype": "float32",
            "world_size": 1,
            "status": "ok",
            "median_ms": median_ms,
            "samples_ms": [median_ms] * 3,
            "cell_wall_s": 1.0,
            "check_s": 0.5,
            "mask_sample": s,
        }
        for s in range(cell.samples)
    ]
    write_rows(path, rows)
    return path


def test_spec_projection_counts_as_left_only_cells_without_rows_of_their_current_digest(tmp_path: Path) -> None:
    from longca.run.serving import planned_unsupported
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = ROOT / "specs" / "default.yaml"
    dense = [c for c in expand(load_spec(spec)) if c.sweep == "dense" and not planned_unsupported(c)]
    cell = dense[0]
    current = sp.project_spec(str(spec), str(_rows_of(tmp_path / "a.parquet", cell.id, cell)), 0.0, 0.0, 10.0)
    older_id = cell.id.rsplit("@", 1)[0] + "@00000000"
    older = sp.project_spec(str(spec), str(_rows_of(tmp_path / "b.parquet", older_id, cell)), 0.0, 0.0, 10.0)
    # the same committed samples project the same cost whichever digest recorded them
    assert current["dense"][:4] == older["dense"][:4]
    # rows of an older digest leave every cell to run; rows of the current one take that cell out
    assert older["dense"][4] == len(dense) and older["dense"][5] == pytest.approx(older["dense"][3])
    assert current["dense"][4] == len(dense) - 1
    cost = current["dense"][3] - current["dense"][5]
    # per draw one 2 ms warm-up and the three 2 ms calls the budget allows; per cell the check's 0.5 s
    assert cost == pytest.approx(cell.samples * (2.0 + 3 * 2.0) / 1000.0 + 0.5)
    # a line per length sums to the line per sweep, the start-up counted once per sweep
    by_length = sp.project_spec(str(spec), str(tmp_path / "a.parquet"), 0.0, 0.0, 10.0, by_length=True)
    parts = [v for k, v in by_length.items() if k.split(" ")[0] == "dense"]
    assert len(parts) == 3  # 256, 512 and the start-up
    for i in range(6):
        assert sum(v[i] for v in parts) == pytest.approx(current["dense"][i])


def test_what_if_projects_a_changed_repeat_with_every_cell_left(tmp_path: Path) -> None:
    from longca.run.serving import planned_unsupported
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = ROOT / "specs" / "default.yaml"
    dense = [c for c in expand(load_spec(spec)) if c.sweep == "dense" and not planned_unsupported(c)]
    cell = dense[0]
    rows = str(_rows_of(tmp_path / "a.parquet", cell.id, cell))
    with_cap = sp.project_spec(str(spec), rows, 0.0, 0.0, 10.0, what_if={"iters": 1000})["dense"]
    with_floor = sp.project_spec(str(spec), rows, 0.0, 0.0, 10.0, what_if={"iters": 1000, "floor_calls": 400})["dense"]
    # a changed repeat is a new digest for every cell: none is done
    assert with_cap[4] == with_floor[4] == len(dense)
    # 2 ms calls of three samples (too few for an interval) run to the spec's 0.5 s budget: 250 calls;
    # a floor of 400 calls takes them past it, for the measured cell and every draw of every cell
    # guessed from it, but its own backward: 5 ms calls (2.5 times its forward's), 100 calls, 300 more
    assert cell.pass_ == "fwd" and cell.samples == 1
    twin = cell.id.rsplit("@", 1)[0].replace("/pass=fwd/", "/pass=bwd/")
    extra = [(300 * 5.0 if c.id.rsplit("@", 1)[0] == twin else 150 * 2.0) / 1000.0 * c.samples for c in dense]
    assert with_floor[3] - with_cap[3] == pytest.approx(sum(extra))


def test_resampled_within_counts_rows_a_floor_would_bring_within_the_goal(tmp_path: Path) -> None:
    from longca.store.write import write_rows

    def row(cell: str, samples: list[float]) -> dict:
        return {
            "cell_id": cell, "cell_digest": cell, "kernel": "naive", "mask": "full", "pass": "fwd",
            "seqlen_q": 8, "seqlen_k": 8, "batch": 1, "heads_q": 1, "heads_kv": 1, "head_dim": 8,
            "dtype": "float32", "world_size": 1, "status": "ok", "samples_ms": samples,
            "median_ms": sorted(samples)[len(samples) // 2], "ci_low_ms": min(samples), "ci_high_ms": max(samples),
        }  # fmt: skip

    path = tmp_path / "rows.parquet"
    spread = [90.0, 95.0, 99.0, 101.0, 105.0, 110.0]
    write_rows(
        path,
        [
            row("tight", [10.0] * 6),  # within +-2% already
            row("spread", spread),  # 100 ms calls spread +-10%: its whole range now
            row("long", [x * 20 for x in spread]),  # 2 s calls keep their samples: never resampled
        ],
    )
    # under the 2 s budget 20 calls of 100 ms leave about +-5%; a floor of 400 calls about +-1%
    assert sp.resampled_within(str(path), floor_calls=0, iters=1000) == (3, 1, 1)
    assert sp.resampled_within(str(path), floor_calls=400, iters=1000) == (3, 1, 2)
    assert sp.resampled_within(str(path), floor_calls=400, iters=20) == (3, 1, 1)  # the cap binds


def test_full_length_agreement_adds_the_comparators_calls(tmp_path: Path) -> None:
    # beyond the check length a forward cell adds its own forward and the comparator's; a backward
    # cell, whose gradients are compared on its timed calls' results, the comparator's forward and
    # backward (at the cell's own forward and backward pace)
    from longca.spec.cells import expand
    from longca.spec.load import load_spec
    from longca.store.aggregate import aggregate

    spec = tmp_path / "t.yaml"
    spec.write_text(
        """
name: t
device: cpu
repeat: {warmup: 1, iters: 3, min_iters: 3, budget_s: 0.5, l2_flush: false}
check: {max_seqlen: 128, agree_with: [sdpa_math]}
kernels: [naive]
masks: [full]
seqlens: [192]
heads: ["4:4"]
head_dims: [32]
dtypes: [float32]
passes: [fwd, bwd]
sweeps: [{name: s}]
"""
    )
    fwd, bwd = sorted(expand(load_spec(spec)), key=lambda c: c.pass_ != "fwd")
    assert bwd.check_dict.get("agree_gradients") and not fwd.check_dict.get("agree_gradients")
    parts = [_rows_of(tmp_path / "f.parquet", fwd.id, fwd, 2.0), _rows_of(tmp_path / "b.parquet", bwd.id, bwd, 5.0)]
    rows = tmp_path / "all.parquet"
    aggregate([str(p) for p in parts], rows)
    got = sp.project_spec(str(spec), str(rows), 0.0, 0.0, 0.0, by_length=False)["s"][3]
    # per cell: one warm-up and three timed calls, the check's 0.5 s, and the agreement
    fwd_s = (2.0 + 3 * 2.0 + 2 * 2.0) / 1000.0 + 0.5
    bwd_s = (5.0 + 3 * 5.0 + (2.0 + 5.0)) / 1000.0 + 0.5
    assert got == pytest.approx(fwd_s + bwd_s)


def test_cells_out_holds_each_left_cells_projected_seconds(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from longca.run.serving import planned_unsupported
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = ROOT / "specs" / "default.yaml"
    cells = [c for c in expand(load_spec(spec)) if not planned_unsupported(c)]
    dense = [c for c in cells if c.sweep == "dense"]
    done, older = dense[0], dense[1]  # one measured under its digest, one under an older one
    rows = _rows_of(tmp_path / "a.parquet", done.id, done)
    _rows_of(tmp_path / "b.parquet", older.id.rsplit("@", 1)[0] + "@00000000", older, median_ms=4.0)
    both = tmp_path / "both.parquet"
    pq.write_table(pa_concat([rows, tmp_path / "b.parquet"]), both)
    out = tmp_path / "estimates.parquet"
    args = ["--rows", str(both), "--spec", str(spec), "--per-row-s", "0", "--per-call-ms", "0", "--cells-out", str(out)]
    assert sp.main(args) == 0
    got = dict(zip(*pq.read_table(out).to_pydict().values()))
    assert done.digest not in got and len(got) == len(cells) - 1  # every left cell, none done
    # the older digest's own samples: per draw a 4 ms warm-up and three 4 ms calls, and its 0.5 s check
    assert got[older.digest] == pytest.approx(older.samples * (4.0 + 3 * 4.0) / 1000.0 + 0.5)
    assert all(s > 0 for s in got.values())  # never measured: the median of measured cells


def pa_concat(paths: list[Path]):
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.concat_tables([pq.read_table(p) for p in paths])


def test_cells_never_measured_project_from_their_forward_rows_or_per_draw_medians(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = ROOT / "specs" / "default.yaml"
    naive = {
        (c.mask, c.pass_): c
        for c in expand(load_spec(spec))
        if c.sweep == "dense" and c.kernel == "naive" and c.seqlen == 256 and c.heads_kv == 4
    }
    x_fwd, x_bwd, y_fwd, y_bwd = (
        naive[k] for k in [("full", "fwd"), ("full", "bwd"), ("causal", "fwd"), ("causal", "bwd")]
    )
    doc_fwd = naive[("causal_document", "fwd")]
    assert doc_fwd.samples == 2 and x_fwd.samples == 1

    def projected(*measured) -> dict[str, float]:
        files = [_rows_of(tmp_path / f"r{i}.parquet", c.id, c, median_ms=ms) for i, (c, ms) in enumerate(measured)]
        both = tmp_path / "rows.parquet"
        pq.write_table(pa_concat(files), both)
        per_cell: dict[str, float] = {}
        sp.project_spec(str(spec), str(both), 0.0, 0.0, 10.0, per_cell=per_cell)
        return per_cell

    # per draw a warm-up call and three timed calls (the budget allows them all), and the 0.5 s check
    def cost(cell, call_ms: float) -> float:
        return cell.samples * 4 * call_ms / 1000.0 + 0.5

    # the backward of a cell measured forward only: its forward calls times 2.5 (no mask in both passes)
    assert projected((x_fwd, 2.0))[x_bwd.digest] == pytest.approx(cost(x_bwd, 5.0))
    # with a mask measured in both passes (2 ms forward, 6 ms backward), that ratio: 3
    per_cell = projected((x_fwd, 2.0), (y_fwd, 2.0), (y_bwd, 6.0))
    assert per_cell[x_bwd.digest] == pytest.approx(cost(x_bwd, 6.0))
    # a sampled mask never measured: its draws times the kernel's median per draw at that length and pass
    assert per_cell[doc_fwd.digest] == pytest.approx(doc_fwd.samples * cost(x_fwd, 2.0))

"""`longca run --shard`: whole configurations per shard, every cell in exactly one shard."""

from longca.commands.run import _config_index
from longca.spec.cells import expand
from longca.spec.load import load_spec


def test_passes_of_one_configuration_share_a_shard_and_shards_cover_all():
    cells = [c for c in expand(load_spec("specs/h200.yaml")) if c.sweep == "dense" and c.seqlen == 4096]
    by_config = {}
    for c in cells:
        by_config.setdefault((c.kernel, c.mask_variant, c.mask, c.heads_q, c.heads_kv), set()).add(_config_index(c) % 2)
    assert all(len(shards) == 1 for shards in by_config.values())
    counts = [sum(1 for c in cells if _config_index(c) % 2 == i) for i in (0, 1)]
    assert sum(counts) == len(cells) and min(counts) > len(cells) / 4


# `longca run --sweep/--only`: a selection that matches nothing is a typo, stopped before any cell runs.

import functools  # noqa: E402

import pytest  # noqa: E402

from longca.cli import main  # noqa: E402


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sweep", "dens"], "--sweep 'dens': no such sweep in 'default'; allowed: cp, dense, shapes, sparse"),
        (["--only", "kernel=cudnn"], "--only kernel=cudnn: no cell of the selected sweeps has it; allowed: "),
        (
            ["--sweep", "dense", "--only", "seqlen=1K"],
            "--only seqlen=1024: no cell of the selected sweeps has it; allowed: 256, 512",
        ),
        (["--only", "colour=red"], "--only: unknown key 'colour'; allowed: kernel, mask, mask_variant, seqlen"),
    ],
)
def test_selection_matching_no_cell_is_an_error_naming_the_allowed_values(tmp_path, capsys, args, message):
    assert main(["run", "--spec", "specs/default.yaml", "--results", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing ran


def test_only_takes_row_column_names_and_written_lengths():
    from longca.spec.select import selector

    cells = expand(load_spec("specs/default.yaml"))
    by_axis = [c.id for c in cells if selector(["seqlen=512", "dtype=fp32"])(c)]
    assert by_axis
    assert by_axis == [c.id for c in cells if selector(["seqlen_q=512", "dtype=float32"])(c)]


def test_selection_limited_to_the_chosen_sweeps(tmp_path, capsys):
    # sparse's kernel exists in the spec, but not in the dense sweep
    assert (
        main(
            [
                "run",
                "--spec",
                "specs/default.yaml",
                "--results",
                str(tmp_path),
                "--sweep",
                "dense",
                "--only",
                "kernel=triton_block_sparse",
            ]
        )
        == 2
    )
    assert "--only kernel=triton_block_sparse: no cell of the selected sweeps has it" in capsys.readouterr().err


# A changed protocol: its cells run again beside the old rows, `aggregate --keep` keeps both, and
# the report draws only each cell's latest measurement.

SPEC_V1 = """\
name: proto
device: cpu
seed: 0
repeat: {warmup: 1, iters: 2, min_iters: 1, budget_s: 0.05, l2_flush: false}
check: {enabled: true, max_seqlen: 64}
heads: ["2:1"]
head_dims: [16]
dtypes: [float32]
passes: [fwd, bwd]
sweeps:
  - name: dense
    kernels: [naive]
    masks: [full, causal]
    seqlens: [64]
  - name: other
    kernels: [sdpa_math]
    masks: [full]
    seqlens: [64]
"""


def test_changed_protocol_reruns_its_sweep_and_the_report_draws_the_latest(tmp_path, capsys):
    import polars as pl
    import pyarrow.parquet as pq

    from longca.report import build_report

    results, v1, v2 = tmp_path / "results", tmp_path / "v1.yaml", tmp_path / "v2.yaml"
    v1.write_text(SPEC_V1)
    # the dense sweep alone gets the sweep-efficiency protocol: new digests there, nowhere else
    v2.write_text(
        SPEC_V1.replace(
            "    seqlens: [64]\n  - name: other",
            "    seqlens: [64]\n    repeat: {warmup: 3, "
            "warmup_s: 0.01, iters: 4, min_iters: 2, budget_s: 0.05, l2_flush: false, "
            "backward: retained_graph}\n  - name: other",
            1,
        )
    )
    assert main(["run", "--spec", str(v1), "--results", str(results)]) == 0
    assert main(["aggregate", "--spec", str(v1), "--results", str(results), "--out", str(tmp_path / "a1.parquet")]) == 0
    files_v1 = set(results.rglob("cell-*.parquet"))
    assert main(["run", "--spec", str(v2), "--results", str(results)]) == 0
    new_files = set(results.rglob("cell-*.parquet")) - files_v1
    assert len(new_files) == 4 and all("sweep=dense" in str(f) for f in new_files)  # 2 masks x 2 passes
    assert (
        main(
            [
                "aggregate",
                "--spec",
                str(v2),
                "--results",
                str(results),
                "--out",
                str(tmp_path / "a2.parquet"),
                "--keep",
                str(tmp_path / "a1.parquet"),
            ]
        )
        == 0
    )
    assert "kept 4 rows of cells outside the spec" in capsys.readouterr().out
    a2 = pq.read_table(tmp_path / "a2.parquet")
    assert a2.num_rows == 4 + 4 + 2  # new dense, old dense, the other sweep once
    dense = pl.from_arrow(a2.select(["sweep", "timer"])).filter(pl.col("sweep") == "dense")
    # old: 4 rows timed the old way; new: 2 forwards, and 2 backwards on one retained graph
    assert sorted(dense.get_column("timer").to_list()) == ["cpu_monotonic"] * 6 + ["cpu_monotonic+retained_graph"] * 2

    build_report([tmp_path / "a2.parquet"], tmp_path / "site", png=False)
    status = (tmp_path / "site" / "status.html").read_text()
    assert "Superseded measurements" in status and "proto (superseded)" in status
    csvs = "".join(p.read_text() for p in (tmp_path / "site" / "charts").glob("*.csv"))
    old_dense = {r["cell_id"] for r in pq.read_table(tmp_path / "a1.parquet").to_pylist() if r["sweep"] == "dense"}
    new_dense = {r["cell_id"] for r in a2.to_pylist() if r["sweep"] == "dense"} - old_dense
    assert len(old_dense) == len(new_dense) == 4
    assert not any(c in csvs for c in old_dense) and all(c in csvs for c in new_dense)  # only the latest drawn


def test_run_writes_the_planned_unsupported_cells_before_any_device_work(tmp_path, monkeypatch):
    import longca.run.chunk

    spec = tmp_path / "order.yaml"
    # varlen takes document masks only: its full-mask cells are planned unsupported, and they come
    # after naive's in plan order
    spec.write_text(
        "name: order\ndevice: cpu\nheads: ['2:2']\nhead_dims: [16]\ndtypes: [float32]\n"
        "passes: [fwd]\nsweeps:\n  - name: dense\n    kernels: [naive, varlen]\n    masks: [full]\n"
        "    seqlens: [64, 128]\n"
    )
    calls = []
    monkeypatch.setattr(longca.run.chunk, "run_chunk", lambda spec, outputs, *a, **k: calls.append(outputs) or 0)
    assert main(["run", "--spec", str(spec), "--results", str(tmp_path / "r")]) == 0
    assert [all("kernel=varlen" in o for o in outs) for outs in calls] == [True, False]
    assert sum(len(o) for o in calls) == 4


def _sample_spec(tmp_path, kernels: str):
    """A CPU spec of full-mask cells at 64, 128 and 256, both passes, for the `--sample` tests."""
    spec = tmp_path / "order.yaml"
    spec.write_text(
        "name: order\ndevice: cpu\nheads: ['2:2']\nhead_dims: [16]\ndtypes: [float32]\n"
        f"passes: [fwd, bwd]\nsweeps:\n  - name: dense\n    kernels: [{kernels}]\n    masks: [full]\n"
        "    seqlens: [64, 128, 256]\n"
    )
    return spec


@pytest.fixture
def sampled(tmp_path, monkeypatch):
    """(drawn, calls): `drawn(spec, *args)` runs `longca run` with its chunks recorded instead of
    run and returns the outputs they would write; `calls` holds the last run's."""
    import longca.run.chunk

    calls = []
    monkeypatch.setattr(longca.run.chunk, "run_chunk", lambda spec, outputs, *a, **k: calls.extend(outputs) or 0)

    def drawn(spec, *extra: str) -> list[str]:
        calls.clear()
        assert main(["run", "--spec", str(spec), "--results", str(tmp_path / "r"), *extra]) == 0
        return sorted(calls)

    return drawn, calls


def test_sample_runs_n_random_device_cells_the_same_for_a_seed(tmp_path, sampled):
    drawn = functools.partial(sampled[0], _sample_spec(tmp_path, "naive, varlen"))
    first = drawn("--sample", "4", "--sample-seed", "1")
    assert len(first) == 4 and all("kernel=naive" in o for o in first)  # varlen's full cells are planned unsupported
    assert drawn("--sample", "4", "--sample-seed", "1") == first  # the same draw for the same seed
    assert len({tuple(drawn("--sample", "4", "--sample-seed", str(seed))) for seed in range(6)}) > 1  # seeds differ
    assert len(drawn("--sample", "100")) == 6  # at most every device cell
    assert all("seqlen_q=64/" in o for o in drawn("--sample", "2", "--only", "seqlen=64"))


def test_sample_from_draws_only_cells_measured_under_their_current_digest(tmp_path, sampled, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = _sample_spec(tmp_path, "naive")
    cells = expand(load_spec(spec))
    published = [c for c in cells if c.seqlen == 128]  # the cells a published set measured
    table = tmp_path / "published.parquet"
    failed = next(c for c in cells if c.seqlen == 256)  # a cell it recorded, but not ok: no median to re-run
    digests = [c.digest for c in published] + ["0123456789abcdef", failed.digest]  # and one of an earlier protocol
    statuses = ["ok"] * len(published) + ["ok", "error"]
    pq.write_table(pa.table({"cell_digest": digests, "status": statuses}), table)
    draw, calls = sampled
    drawn = functools.partial(draw, spec)
    # every draw comes from the published cells, whatever the seed; a larger N takes them all
    for seed in range(4):
        got = drawn("--sample", "1", "--sample-seed", str(seed), "--sample-from", str(table))
        assert len(got) == 1 and "seqlen_q=128/" in got[0]
    assert len(drawn("--sample", "10", "--sample-from", str(table))) == len(published) == 2
    # a selection that no published cell is in, a table without digests, or no --sample: clear errors,
    # before any cell runs
    calls.clear()
    assert (
        main(
            [
                "run",
                "--spec",
                str(spec),
                "--results",
                str(tmp_path / "r"),
                "--sample",
                "1",
                "--sample-from",
                str(table),
                "--only",
                "seqlen=64",
            ]
        )
        == 2
    )
    assert "has rows of its current digest" in capsys.readouterr().err
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"cell_id": ["x"]}), other)
    assert main(["run", "--spec", str(spec), "--sample", "1", "--sample-from", str(other)]) == 2
    assert "cell_digest column" in capsys.readouterr().err
    assert main(["run", "--spec", str(spec), "--sample-from", str(table)]) == 2
    assert "only with --sample" in capsys.readouterr().err
    assert not calls


def test_a_results_folder_that_cannot_be_written_is_one_line_naming_the_path(tmp_path):
    import subprocess
    import sys

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: x\ndevice: cpu\nkernels: [naive]\nmasks: [full]\nseqlens: [64]\nheads: ['2:2']\n"
        "head_dims: [16]\ndtypes: [float32]\npasses: [fwd]\nsweeps: [{name: s}]\n"
    )
    cmd = [sys.executable, "-m", "longca.cli", "run", "--spec", str(spec), "--results", str(blocker / "results")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"longca: error: {blocker}/results") and "Not a directory" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr

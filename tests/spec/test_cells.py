"""Matrix expansion: counts, stable ids, exclusions, hive paths that readers parse."""

from collections import Counter

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longca.spec.cells import expand
from longca.spec.load import load_spec

SPEC = """
name: t
device: cpu
kernels: [naive, sdpa_math]
masks: [full, {name: sliding_window, window: 8}]
seqlens: [64, "1K"]
heads: ["4:4", "4:2"]
head_dims: [16]
dtypes: [float32, bf16]
passes: [fwd, bwd]
sweeps:
  - name: dense
    exclude:
      - {kernel: naive, seqlen: 1K}
  - name: cp
    kernels: [naive]
    masks: [causal]
    seqlens: [64]
    dtypes: [float64]
    cp: {mechanisms: [ring_p2p, usp], world_sizes: [2, 4]}
"""


def test_counts_and_exclusion():
    cells = expand(load_spec(text=SPEC))
    dense = [c for c in cells if c.sweep == "dense"]
    assert len(dense) == 2 * 2 * 2 * 2 * 2 * 2 - 1 * 2 * 2 * 2 * 2  # naive at 1K excluded
    assert not [c for c in dense if c.kernel == "naive" and c.seqlen == 1024]
    cp = [c for c in cells if c.sweep == "cp"]
    # ring_p2p: one layout per world size; usp: every divisor of the world size.
    assert len(cp) == (1 + 1) * 2 * 2 + (2 + 3) * 2 * 2
    assert {dict(c.cp_degrees)["ulysses"] for c in cp if c.cp_mechanism == "usp" and c.world_size == 4} == {1, 2, 4}


def test_ids_are_stable_and_unique():
    a = expand(load_spec(text=SPEC))
    b = expand(load_spec(text=SPEC))
    assert [c.id for c in a] == [c.id for c in b]
    assert len({c.relpath() for c in a}) == len(a)
    assert "kernel=naive/mask=full" in a[0].id


def test_cached_digest_survives_json_and_pickle_and_stays_out_of_the_fields():
    import dataclasses
    import pickle

    from longca.spec.cells import Cell

    cells = expand(load_spec(text=SPEC))
    for c in cells[:5]:
        d = c.digest  # computed once, then held by the instance
        assert Cell.from_json(c.to_json()).digest == d
        assert pickle.loads(pickle.dumps(c)).digest == d
        assert "digest" not in {f.name for f in dataclasses.fields(c)}
    assert len({c.digest for c in cells}) == len(cells) == len(set(cells))


def test_changing_a_non_path_field_changes_the_file_only():
    a = {c.id.split("@")[0]: c.relpath() for c in expand(load_spec(text=SPEC))}
    b = {c.id.split("@")[0]: c.relpath() for c in expand(load_spec(text=SPEC + "repeat: {iters: 7}\n"))}
    assert a.keys() == b.keys()
    assert all(a[k] != b[k] for k in a)


def test_hive_paths_match_columns(tmp_path):
    cells = expand(load_spec(text=SPEC))[:3]
    for c in cells:
        path = tmp_path / c.relpath()
        path.parent.mkdir(parents=True)
        pq.write_table(pa.table({"kernel": [c.kernel], "seqlen_q": [c.seqlen], "mask": [c.mask]}), path)
    rows = duckdb.sql(
        f"SELECT kernel, seqlen_q, mask, dtype FROM read_parquet('{tmp_path}/**/*.parquet', "
        "hive_partitioning=true) ORDER BY ALL"
    ).fetchall()
    assert sorted(rows) == sorted((c.kernel, c.seqlen, c.mask, c.dtype) for c in cells)


def test_auto_balance_is_contiguous_without_a_ring():
    """Pure Ulysses attends the whole sequence on every rank: auto keeps the natural order, so a
    causal mask stays one causal slice after the all-to-all; any ring degree > 1 keeps zigzag."""
    from longca.cp.sharding import make_sharding
    from longca.cp.submask import layouts_of_groups, sub_mask
    from longca.masks.registry import build_mask
    from longca.masks.slices import area

    spec = load_spec(
        text="""
name: t
device: cpu
kernels: [naive]
masks: [causal, full_document, full, prefix_lm_causal, {name: causal_sliding_window, window: 16}]
seqlens: [64]
heads: ["4:4"]
head_dims: [16]
dtypes: [float64]
passes: [fwd]
sweeps:
  - name: cp
    cp: {mechanisms: [ulysses, ring_p2p, usp], world_sizes: [4]}
"""
    )
    got = {(c.cp_mechanism, dict(c.cp_degrees).get("ring", 1), c.mask): c.cp_balance for c in expand(spec)}
    assert got[("ulysses", 1, "causal")] == got[("ulysses", 1, "full_document")] == "contiguous"
    assert got[("usp", 1, "causal")] == "contiguous"  # usp with ulysses degree 4 = world: no ring
    assert got[("ring_p2p", 4, "causal")] == got[("usp", 2, "causal")] == "zigzag"
    assert got[("ring_p2p", 4, "full_document")] == "document"
    assert got[("ring_p2p", 4, "full")] == "contiguous"
    # zigzag only where it evens the work exactly; the heterogeneous masks get area balance
    assert got[("ring_p2p", 4, "causal_sliding_window")] == "zigzag"
    assert got[("ring_p2p", 4, "prefix_lm_causal")] == "document"

    # Why: the gathered Ulysses sequence under zigzag is a permuted causal mask of several pieces.
    mask = build_mask("causal", 64)
    for balance, pieces in (("contiguous", 1), ("zigzag", 5)):
        sh = make_sharding(balance, 64, 2)
        (layout,) = layouts_of_groups(sh.intervals, [[0, 1]])
        local = sub_mask(mask.slices, layout, layout)
        assert len(local) == pieces, (balance, local)
        assert area(local) == mask.area_per_head  # same pairs, only their order differs


# Digests of committed cells, from the `cell_digest` column of results/<spec>/all.parquet (and, for
# default.yaml, from the code before repeat.warmup_s existed). A digest names the cell's result
# file: if one changes, every committed result of that spec would be measured again.
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
KNOWN_DIGESTS = {
    "h200.yaml": {
        # every sweep moved to one protocol (adaptive +-1% interval, three mask draws, full-length
        # agreement beyond 8K, graph replay): every cell is measured again, the earlier rows
        # superseded cell by cell
        "dense/kernel=sdpa_cudnn/mask=full/mask_variant=default/seqlen_q=1024/heads_q=64/heads_kv=8/head_dim=128/"
        "dtype=bfloat16/pass=fwd/batch=1": "077abeada9b09b49",
        "dense_baselines/kernel=naive/mask=full/mask_variant=default/seqlen_q=1024/heads_q=64/heads_kv=8/"
        "head_dim=128/dtype=bfloat16/pass=fwd/batch=1": "6b38f1dd135e507c",
        "long/kernel=sdpa_cudnn/mask=full/mask_variant=default/seqlen_q=65536/heads_q=64/heads_kv=8/head_dim=128/"
        "dtype=bfloat16/pass=fwd/batch=1": "b5535abe27cb8b9c",
        "sparse/kernel=triton_block_sparse/mask=block_sparse/mask_variant=block-128_density-0.5/seqlen_q=16384/"
        "heads_q=64/heads_kv=8/head_dim=128/dtype=bfloat16/pass=fwd/batch=1": "48d71ad2b37ad0a2",
        "linear/kernel=fla_linear_attn/mask=causal/mask_variant=default/seqlen_q=1024/heads_q=64/heads_kv=64/"
        "head_dim=128/dtype=bfloat16/pass=fwd/batch=1": "0ece47a5bed7af3a",
    },
    "h200-cp.yaml": {
        "cp_goal/kernel=sdpa_cudnn/mask=full/mask_variant=default/seqlen_q=65536/heads_q=64/heads_kv=8/head_dim=128/"
        "dtype=bfloat16/pass=fwd/batch=1/world_size=2/cp_mechanism=ring_p2p/cp_variant=ring2-contiguous": "e21a85645ea82b07",
    },
    "default.yaml": {
        "dense/kernel=naive/mask=full/mask_variant=default/seqlen_q=256/heads_q=4/heads_kv=4/head_dim=32/"
        "dtype=float32/pass=fwd/batch=1": "f94ba51065d2b9bb",
        "cp/kernel=naive/mask=block_sparse/mask_variant=block-64_density-0.5/seqlen_q=256/heads_q=4/heads_kv=2/"
        "head_dim=32/dtype=float32/pass=bwd/batch=1/world_size=2/cp_mechanism=ring_p2p/cp_variant=ring2-contiguous": "c56f288c02c84314",
    },
}


# specs that set the optional repeat keys themselves
SETS_OPTIONAL_REPEAT = {"h200.yaml"}


def test_shipped_specs_keep_their_cell_digests():
    for name, known in KNOWN_DIGESTS.items():
        cells = {f"{c.sweep}/{c.id.rsplit('@', 1)[0]}": c for c in expand(load_spec(ROOT / "specs" / name))}
        for key, digest in known.items():
            assert key in cells, f"{name}: no cell {key}"
            assert cells[key].digest == digest, f"{name}: {key} changed digest"
            if name not in SETS_OPTIONAL_REPEAT:
                for optional in ("warmup_s", "backward"):  # an optional key is never defaulted in
                    assert optional not in dict(cells[key].repeat)


def test_h200_runs_every_sweep_under_one_protocol():
    cells = expand(load_spec(ROOT / "specs" / "h200.yaml"))
    assert {c.repeat for c in cells} == {
        tuple(
            sorted(
                {
                    "warmup": 3,
                    "warmup_s": 0.05,
                    "iters": 1000,
                    "min_iters": 3,
                    "budget_s": 2.0,
                    "ci_target": 0.01,
                    "l2_flush": True,
                    "backward": "retained_graph",
                    "graph": True,
                    "graph_below_ms": 20,
                }.items()
            )
        )
    }
    # three draws of every sampled mask at every length, the same for every kernel
    sampled = [c for c in cells if c.mask in ("causal_document", "block_sparse", "prefix_lm_causal")]
    assert sampled and {c.samples for c in sampled} == {3}
    # full-length agreement only where the check runs shorter than the cell
    assert all(("agree_with" in c.check_dict) == (c.seqlen > 8192) for c in cells)


@pytest.mark.parametrize("name", ["default.yaml", "h200.yaml", "h200-cp.yaml"])
def test_a_published_spec_measures_each_configuration_once(name):
    # Two sweeps measuring one configuration would draw two points for it in one series; the
    # report's head-dim study reads D=128 bf16 from the dense sweep instead (specs exclude it).
    # (specs/h200-efficiency-probe.yaml re-measures cells under other protocols on purpose.)
    seen = Counter(c.id.rsplit("@", 1)[0] for c in expand(load_spec(ROOT / "specs" / name)))
    assert [k for k, n in seen.items() if n > 1] == []


def test_h200_shape_study_adds_head_dims_fp16_and_fp8_under_the_dense_protocol():
    cells = expand(load_spec(ROOT / "specs" / "h200.yaml"))
    dense_repeat = {c.repeat for c in cells if c.sweep == "dense"}
    shapes = [c for c in cells if c.sweep == "shapes"]
    assert {c.repeat for c in shapes} == dense_repeat
    assert {(c.head_dim, c.dtype) for c in shapes} == {
        (64, "bfloat16"),
        (256, "bfloat16"),
        (128, "float16"),
        *((d, "float8_e4m3fn") for d in (64, 128, 256)),
    }
    assert {c.seqlen for c in shapes} == {4096, 16384} and {(c.heads_q, c.heads_kv) for c in shapes} == {(64, 8)}
    # the D=128 bf16 comparison point is the dense sweep's own cell, at both lengths
    for length in (4096, 16384):
        assert {c.head_dim for c in cells if c.sweep == "dense" and c.seqlen == length} == {128}


def test_warmup_budget_is_part_of_the_digest_only_where_set():
    text = SPEC.replace("  - name: cp\n", "  - name: cp\n    repeat: {warmup_s: 0.5}\n")
    before, after = expand(load_spec(text=SPEC)), expand(load_spec(text=text))
    assert [c.relpath() for c in before if c.sweep == "dense"] == [c.relpath() for c in after if c.sweep == "dense"]
    cp_before = {c.id.rsplit("@", 1)[0]: c.digest for c in before if c.sweep == "cp"}
    cp_after = {c.id.rsplit("@", 1)[0]: c for c in after if c.sweep == "cp"}
    assert cp_before.keys() == cp_after.keys()
    assert all(cp_after[k].digest != d and dict(cp_after[k].repeat)["warmup_s"] == 0.5 for k, d in cp_before.items())


def test_a_late_dtype_tolerance_joins_only_its_own_cells():
    """fp8's default tolerance came after the first sweeps: adding fp8 to a spec leaves every other
    cell's digest (its file name) as it was, and only the fp8 cells carry the new entry."""
    import json

    from longca.spec.model import LATE_TOLERANCES

    before = expand(load_spec(text=SPEC))
    after = expand(load_spec(text=SPEC.replace("dtypes: [float32, bf16]", "dtypes: [float32, bf16, fp8]")))
    fp8 = [c for c in after if c.dtype == "float8_e4m3fn"]
    # the dense sweep's cells once more in fp8 (the cp sweep sets its own dtype)
    assert len(after) == len(before) + len(fp8) and len(fp8) == sum(c.sweep == "dense" for c in before) // 2 == 24
    assert {c.digest for c in before} == {c.digest for c in after if c.dtype != "float8_e4m3fn"}
    assert all(json.loads(c.check)["tolerance"]["float8_e4m3fn"] == LATE_TOLERANCES["float8_e4m3fn"] for c in fp8)
    assert not any("float8_e4m3fn" in json.loads(c.check)["tolerance"] for c in after if c.dtype != "float8_e4m3fn")
    own = expand(
        load_spec(
            text=SPEC.replace("dtypes: [float32, bf16]", "dtypes: [fp8]")
            + "check: {tolerance: {float8_e4m3fn: 0.05}}\n"
        )
    )
    assert {json.loads(c.check)["tolerance"]["float8_e4m3fn"] for c in own if c.dtype == "float8_e4m3fn"} == {0.05}


def test_cells_come_problem_by_problem_with_every_kernel_of_a_problem_together():
    """Lengths rise within a sweep, and the kernels of one problem (length, mask, shape, dtype,
    pass) follow each other: they share its masks and full-length comparator results."""
    dense = [c for c in expand(load_spec(text=SPEC)) if c.sweep == "dense"]
    assert [c.seqlen for c in dense] == sorted(c.seqlen for c in dense)
    problems = [(c.seqlen, c.mask, c.heads_q, c.heads_kv, c.head_dim, c.dtype, c.batch, c.pass_) for c in dense]
    runs = [p for i, p in enumerate(problems) if i == 0 or problems[i - 1] != p]
    assert len(runs) == len(set(problems))  # each problem is one run of adjacent cells
    first = [c.kernel for c in dense if c.seqlen == 64][:2]
    assert first == ["naive", "sdpa_math"]  # the sweep's kernel order within a problem

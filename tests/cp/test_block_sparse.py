"""Distributed block-sparse attention: block_sparse and variable_block_sparse masks (different kept
blocks per KV head) through every CP mechanism, on gloo groups of 2 and 4 CPU processes, against
the single-process dense reference in output and q/k/v gradients.

- the step sub-layouts cut from the global block lists equal the dense mask restricted to the
  shards, head by head (single process);
- naive local kernel, float64: every mechanism x both masks x contiguous / zigzag x GQA / MHA,
  shard boundaries on block boundaries (S=512) and across them (S=576 at 4 ranks);
- Triton block-sparse local kernel (TRITON_INTERPRET=1 on CPU), float32: Ring P2P (aligned and
  misaligned shards, uniform and variable blocks), Ring all-gather and Ulysses;
- FlexAttention local kernel, forward only (no CPU backward);
- bench cells: rows with exact areas and FLOPs, and the unsupported paths.
One spawned group per world size runs every case (process start-up dominates otherwise).
"""

from __future__ import annotations

import json
import os
import traceback

import numpy as np
import pyarrow.parquet as pq
import pytest
import rank_hits
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from longca.cp.mechanisms import build_plan, cp_attention
from longca.cp.reference import reference_attention
from longca.cp.sharding import make_sharding
from longca.cp.submask import layout_step_areas, sub_layout
from longca.kernels.adapters.naive import RankNaive as Naive
from longca.kernels.adapters.triton_block_sparse import RankTritonBlockSparse as TritonBlockSparse
from longca.kernels.base import Unsupported
from longca.kernels.registry import rank_kernel
from longca.masks.registry import build_mask
from longca.measure.reference import relative_error
from longca.run.chunk import free_port
from longca.run.ranks import run_cell as run_cp_cell
from longca.store.write import write_rows

from ..run.cp_cells import cp_cell

MASKS = {
    "bs": ("block_sparse", {"block": 64, "density": 0.5}),
    "vbs": ("variable_block_sparse", {"min_block": 24, "mean_block": 72, "density": 0.4}),
}
MECHS = {
    2: [
        ("ring_p2p", None),
        ("ring_allgather", None),
        ("ulysses", None),
        ("usp", {"ulysses": 2, "ring": 1}),
        ("loongtrain", {"ulysses": 1, "ring": 2, "windows": 2}),
    ],
    4: [
        ("ring_p2p", None),
        ("ring_allgather", None),
        ("ulysses", None),
        ("usp", {"ulysses": 2, "ring": 2}),
        ("loongtrain", {"ulysses": 1, "ring": 4, "windows": 2}),
        ("loongtrain", {"ulysses": 2, "ring": 2, "windows": 2}),
    ],
}
SEQLEN = {2: 512, 4: 576}  # 576 / 4 = 144 and 576 / 8 = 72: shard boundaries cut 64-token blocks
HEADS = [(4, 2), (4, 4)]
BATCH, HEAD_DIM = 1, 16
# Triton cases (slow under the interpreter): (world, mechanism, degrees, mask, balance, heads).
TRITON = [
    (2, "ring_p2p", None, "bs", "contiguous", (4, 2)),
    (2, "ring_p2p", None, "vbs", "zigzag", (2, 2)),
    (2, "ulysses", None, "bs", "zigzag", (4, 2)),
    (4, "ring_p2p", None, "bs", "contiguous", (4, 2)),
]
TOL = {"naive": 1e-10, "triton": 1e-4, "flex": 1e-10}


def _mask(key: str, seqlen: int, hkv: int):
    if key == "diag":  # every head: the diagonal blocks; odd heads also block column 0
        from longca.masks.blocks import BlockLayout
        from longca.masks.mask import Mask

        bounds = np.arange(0, seqlen + 1, 64)
        kept = np.repeat(np.eye(len(bounds) - 1, dtype=bool)[None], hkv, axis=0)
        kept[1::2, :, 0] = True
        return Mask(
            "diag", seqlen, seqlen, np.zeros((0, 5), dtype=np.int64), blocks=BlockLayout(bounds, bounds, kept, 64)
        )
    name, params = MASKS[key]
    return build_mask(name, seqlen, params, seed=5, heads_kv=hkv)


def _inputs(seqlen: int, hq: int, hkv: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(BATCH, hq, seqlen, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(BATCH, hkv, seqlen, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(2))
    return q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype)


# ------------------------------------------------------------------------- single process
@pytest.mark.parametrize("key", sorted(MASKS))
def test_step_layouts_are_the_dense_mask_restricted_to_the_shards(key):
    seqlen, hkv = 576, 3
    mask = _mask(key, seqlen, hkv)
    dense = mask.dense()
    assert dense.shape == (hkv, seqlen, seqlen)
    assert not all(np.array_equal(mask.blocks.kept[0], mask.blocks.kept[h]) for h in range(1, hkv))
    odd = (((0, 100), (300, 340)), ((100, 300),), ((340, 576),))  # uneven, out of order, mid-block
    shardings = [make_sharding(b, seqlen, w).intervals for b in ("contiguous", "zigzag") for w in (2, 4)]
    for layouts in shardings + [odd]:
        areas = layout_step_areas(mask.blocks, list(layouts))
        assert areas.sum(axis=(1, 2)).tolist() == mask.area_of_heads().tolist()
        pos = [np.concatenate([np.arange(a, b) for a, b in lay]) for lay in layouts]
        for i, qa in enumerate(layouts):
            for j, ka in enumerate(layouts):
                heads = np.array([2, 0])
                sub = sub_layout(mask.blocks, qa, ka, heads)
                rq, rk = np.diff(sub.q_bounds), np.diff(sub.k_bounds)
                got = np.repeat(np.repeat(sub.kept, rq, axis=1), rk, axis=2)
                want = dense[heads][:, pos[i]][:, :, pos[j]]
                assert np.array_equal(got, want)
                assert sub.area_per_head().tolist() == areas[heads, i, j].tolist()


def test_local_kernels_on_a_step_layout_match_the_reference():
    """Naive (float64) and Triton (float32) on one misaligned step: output, LSE-merged gradients."""
    seqlen = 576
    mask = _mask("vbs", seqlen, 2)
    qa, ka = ((0, 100), (300, 340)), ((100, 300), (340, 400))
    sub = sub_layout(mask.blocks, qa, ka)
    pq = np.concatenate([np.arange(a, b) for a, b in qa])
    pk = np.concatenate([np.arange(a, b) for a, b in ka])
    from longca.masks.mask import Mask

    local = Mask("step", len(pq), len(pk), np.zeros((0, 5), dtype=np.int64), blocks=sub)
    for kernel, dtype, tol in ((Naive(), torch.float64, 1e-12), (TritonBlockSparse(), torch.float32, 1e-4)):
        q, k, v, do = _inputs(seqlen, 4, 2, dtype, 3)
        q, do, k, v = q[:, :, pq], do[:, :, pq], k[:, :, pk], v[:, :, pk]
        ref = reference_attention(q, k, v, local, do)
        s = kernel.prepare_blocks(sub, 4, torch.device("cpu"))
        out, lse = kernel.fwd(q, k, v, s)
        assert relative_error(out, ref[0]) < tol, kernel.name
        for got, want in zip(kernel.bwd(do, q, k, v, out, lse, s), ref[1:]):
            assert relative_error(got, want) < tol, kernel.name


# ---------------------------------------------------------------------------- distributed
def _case(rank, world, kernel_name, mech, degrees, key, balance, hq, hkv, dtype, backward=True):
    seqlen = SEQLEN[world]
    case = {
        "kernel": kernel_name,
        "mech": mech,
        "degrees": degrees,
        "mask": key,
        "balance": balance,
        "heads": f"{hq}:{hkv}",
        "world": world,
    }
    try:
        mask = _mask(key, seqlen, hkv)
        q, k, v, dout = _inputs(seqlen, hq, hkv, dtype, 11)
        ref = reference_attention(q, k, v, mask, dout if backward else None)
        sharding = make_sharding(balance, seqlen, world)
        pos = torch.from_numpy(sharding.positions(rank))
        plan = build_plan(
            mech,
            degrees,
            mask.slices,
            sharding,
            rank,
            hq,
            hkv,
            rank_kernel(kernel_name),
            torch.device("cpu"),
            blocks=mask.blocks,
        )
        ql, kl, vl = (x[:, :, pos].contiguous().requires_grad_(backward) for x in (q, k, v))
        if backward:
            out = cp_attention(ql, kl, vl, plan)
            out.backward(dout[:, :, pos].contiguous())
            mine = (out, ql.grad, kl.grad, vl.grad)
        else:
            with torch.no_grad():
                mine = (cp_attention(ql, kl, vl, plan),)
        t = torch.tensor([relative_error(a, b[:, :, pos]) for a, b in zip(mine, ref)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        skipped = torch.tensor([sum(s.empty for s in plan.subs)])
        dist.all_reduce(skipped)
        case.update(errors=t.tolist(), rank_area=plan.rank_area(3), area=3 * mask.area_per_head, skipped=int(skipped))
    except Exception:
        case["failure"] = traceback.format_exc()
    return case


BENCH_PARAMS = {"block": 64, "density": 0.5}
_BENCH = dict(mask="block_sparse", mask_params=BENCH_PARAMS, seqlen=256, head_dim=16, cp_balance="contiguous")
BENCH = {  # CP cells run by longca.run.ranks, the CP cell runner
    "ok_ring": cp_cell(**_BENCH),
    "ok_ulysses_vbs_fwd": cp_cell(
        **dict(
            _BENCH,
            cp_mechanism="ulysses",
            cp_degrees=(("ulysses", 2),),
            mask="variable_block_sparse",
            pass_="fwd",
            mask_params={"min_block": 16, "mean_block": 48, "density": 0.3},
        )
    ),
    "document": cp_cell(**dict(_BENCH, cp_balance="document")),
    "importance": cp_cell(**dict(_BENCH, mask_params={"block": 64, "score": "importance"})),
    "ok_triton": cp_cell(**dict(_BENCH, kernel="triton_block_sparse", dtype="float32", pass_="fwd")),
    "triton_slices": cp_cell(
        **dict(_BENCH, mask="causal", mask_params={}, kernel="triton_block_sparse", dtype="float32")
    ),
}


def _naive_combos(world: int, m: int) -> list:
    """(mask, balance, heads) for mechanism number m: all 8 at world 2; at world 4 (4 processes
    on 2 cores in CI) two per mechanism, in rotation so that each of the 8 runs at least once
    (Ulysses gets variable blocks on contiguous shards with KV replication, Hkv 2 < degree 4)."""
    combos = [(k, b, h) for k in MASKS for b in ("contiguous", "zigzag") for h in HEADS]
    return combos if world == 2 else [combos[(2 * m) % 8], combos[(2 * m + 1) % 8]]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = []
    for m, (mech, degrees) in enumerate(MECHS[world]):
        for key, balance, (hq, hkv) in _naive_combos(world, m):
            results.append(_case(rank, world, "naive", mech, degrees, key, balance, hq, hkv, torch.float64))
    for w, mech, degrees, key, balance, (hq, hkv) in TRITON:
        if w == world:
            results.append(
                _case(rank, world, "triton_block_sparse", mech, degrees, key, balance, hq, hkv, torch.float32)
            )
    if world == 2:  # ring steps with no kept block are skipped (rank 0's second step here)
        for kernel_name, dtype in (("naive", torch.float64), ("triton_block_sparse", torch.float32)):
            results.append(_case(rank, world, kernel_name, "ring_p2p", None, "diag", "contiguous", 4, 2, dtype))
        for key in MASKS:
            results.append(
                _case(rank, world, "flex", "ring_p2p", None, key, "zigzag", 4, 2, torch.float64, backward=False)
            )
        for name, cell in BENCH.items():
            rows = run_cp_cell(cell, rank, world, torch.device("cpu"))
            if rank == 0:
                write_rows(os.path.join(out_dir, f"{name}.parquet"), rows)
    if rank == 0:
        with open(os.path.join(out_dir, "cases.json"), "w") as f:
            json.dump(results, f)
    dist.barrier()
    rank_hits.save(out_dir)  # for the mutation score (tests/support/rank_hits.py)
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_block_sparse_cp_matches_the_reference(world: int, tmp_path) -> None:
    mp.start_processes(_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, start_method="spawn")
    rank_hits.merge(tmp_path)
    results = json.load(open(tmp_path / "cases.json"))
    kinds = {"naive": "naive", "triton_block_sparse": "triton", "flex": "flex"}
    bad = [r for r in results if "failure" in r or max(r["errors"]) > TOL[kinds[r["kernel"]]]]
    summary = [
        (
            {k: r[k] for k in ("kernel", "mech", "degrees", "mask", "balance", "heads")},
            r.get("errors") or r["failure"][-400:],
        )
        for r in bad
    ]
    assert not bad, f"{len(bad)} failing cases, first: {summary[:4]}"
    n_triton = sum(1 for t in TRITON if t[0] == world)
    n_naive = sum(len(_naive_combos(world, m)) for m in range(len(MECHS[world])))
    assert len(results) == n_naive + n_triton + (4 if world == 2 else 0)
    for r in results:  # per-rank areas add up to the mean area per head (3 batch elements)
        assert sum(r["rank_area"]) == round(r["area"])
    assert [r["skipped"] for r in results if r["mask"] == "diag"] == [1, 1] * (world == 2)
    if world != 2:
        return
    rows = {name: pq.read_table(tmp_path / f"{name}.parquet").to_pylist()[0] for name in BENCH}
    ok = rows["ok_ring"]
    assert ok["status"] == "ok", ok["reason"]
    mask = build_mask("block_sparse", 256, BENCH_PARAMS, heads_kv=2)
    per_kv_head = mask.area_of_heads()
    assert ok["mask_area"] == sum(ok["rank_area"]) == round(2 * per_kv_head.mean())
    assert ok["flops"] == 3.5 * 4 * 2 * int(per_kv_head.sum()) * 2 * 16  # 2 query heads per KV head
    assert ok["mask_form"] == "block_sparse" and ok["density"] == pytest.approx(per_kv_head.mean() / 256**2)
    assert max(ok[k] for k in ("rel_err_out", "rel_err_dq", "rel_err_dk", "rel_err_dv")) < 1e-12
    uly = rows["ok_ulysses_vbs_fwd"]
    assert uly["status"] == "ok", uly["reason"]
    assert uly["rel_err_out"] < 1e-12 and uly.get("rel_err_dq") is None
    assert rows["document"]["status"] == "unsupported" and "balance='document'" in rows["document"]["reason"]
    assert rows["importance"]["status"] == "unsupported" and "score='random'" in rows["importance"]["reason"]
    tri = rows["ok_triton"]
    assert tri["status"] == "ok", tri["reason"]
    assert tri["backend"].startswith("triton tiles fwd=64,")  # named as single-GPU rows name theirs
    assert rows["ok_ring"]["backend"] == "naive"
    assert rows["triton_slices"]["status"] == "unsupported"
    assert "takes block-sparse masks" in rows["triton_slices"]["reason"]


def test_a_layout_for_the_wrong_number_of_kv_heads_is_rejected():
    """Never reuse one head's layout for others: a layout built for 1 KV head cannot run 2."""
    mask = _mask("bs", 256, 1)
    with pytest.raises(ValueError, match="layouts for 1 KV heads but heads_kv=2"):
        build_plan(
            "ring_p2p",
            None,
            mask.slices,
            make_sharding("contiguous", 256, 2),
            0,
            4,
            2,
            Naive(),
            torch.device("cpu"),
            blocks=mask.blocks,
        )
    with pytest.raises(ValueError, match="layouts for 1 KV heads, the inputs 2"):
        q, k, v, _ = _inputs(256, 4, 2, torch.float64, 0)
        reference_attention(q, k, v, mask)


def test_a_kernel_without_block_layouts_is_refused_by_name():
    """A slice-only per-rank kernel (`takes_blocks` False) is refused a block-sparse plan before any
    step is prepared, naming the kernels that take layouts; its `prepare_blocks` refuses likewise."""
    mask = _mask("bs", 256, 1)
    kernel = rank_kernel("sdpa_cudnn")
    takers = r"\['flex', 'naive', 'triton_block_sparse'\]"
    with pytest.raises(Unsupported, match=rf"'sdpa_cudnn' takes slice masks only .*one of {takers}"):
        sharding = make_sharding("contiguous", 256, 2)
        build_plan("ring_p2p", None, mask.slices, sharding, 0, 4, 1, kernel, torch.device("cpu"), blocks=mask.blocks)
    with pytest.raises(Unsupported, match="per-rank kernel 'sdpa_cudnn' takes slice masks only"):
        kernel.prepare_blocks(mask.blocks, 4, torch.device("cpu"))

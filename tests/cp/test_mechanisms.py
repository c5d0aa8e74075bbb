"""Every mechanism x every static mask x every balance, on gloo process groups of 2 and 4 CPU
processes, matches the single-process float64 reference in output and q/k/v gradients.

One spawned group per world size loops over all cases (process start-up dominates otherwise)."""

from __future__ import annotations

import datetime
import json
import os
import traceback

import pytest
import rank_hits
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from longca.cp.mechanisms import build_plan, cp_attention
from longca.cp.reference import reference_attention
from longca.cp.sharding import BALANCES, make_sharding
from longca.kernels.base import Unsupported
from longca.kernels.registry import rank_kernel
from longca.masks.registry import PATTERNS, build_mask
from longca.measure.reference import relative_error
from longca.run.chunk import free_port

STATIC = sorted(n for n, p in PATTERNS.items() if p.family != "dynamic")
SEQLEN, BATCH, HQ, HKV, HEAD_DIM = 48, 2, 4, 2, 8
TOL = 1e-10
FLEX_MECHANISMS = ("ring_p2p", "ulysses", "ring_allgather")
CASES = {
    2: [
        ("ulysses", None),
        ("ring_p2p", None),
        ("ring_allgather", None),
        ("usp", {"ulysses": 2, "ring": 1}),
        ("loongtrain", {"ulysses": 1, "ring": 2, "windows": 2}),
    ],
    4: [
        ("ulysses", None),
        ("ring_p2p", None),
        ("ring_allgather", None),
        ("usp", {"ulysses": 2, "ring": 2}),
        ("loongtrain", {"ulysses": 1, "ring": 4, "windows": 2}),
        ("loongtrain", {"ulysses": 2, "ring": 2, "windows": 2}),
        # the degrees specs/cp-scale.yaml and the model use: 4 windows (where the outer ring's order
        # matters: with 2 windows reversing it changes nothing), and USP all-Ulysses or all-ring
        ("loongtrain", {"ulysses": 1, "ring": 4, "windows": 4}),
        ("usp", {"ulysses": 4, "ring": 1}),
        ("usp", {"ulysses": 1, "ring": 4}),
    ],
    # 8 processes on the CI's 2 cores: the splits of world 8 the model's spec names
    8: [
        ("usp", {"ulysses": 4, "ring": 2}),
        ("usp", {"ulysses": 2, "ring": 4}),
        ("loongtrain", {"ulysses": 1, "ring": 8, "windows": 4}),
        ("loongtrain", {"ulysses": 2, "ring": 4, "windows": 2}),
    ],
}


def small_params(name: str, doc_file: str) -> dict:
    """Parameters that make every mask non-trivial at a few dozen tokens."""
    out = {}
    for p in PATTERNS[name].params:
        if p.name == "distribution" and p.default == "auto":
            out["distribution"] = f"file:{doc_file}"
        elif p.name == "window":
            out["window"] = 5
        elif p.name == "block":
            out["block"] = 4
        elif p.name == "global_tokens":
            out["global_tokens"] = 3
    return out


def _worker(rank: int, world: int, port: int, doc_file: str, result_file: str) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    # A rank that fails mid-collective makes the others time out (an error) instead of waiting forever.
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        # a mutation run (README, Reliability) shortens it: a mutant that stalls one rank ends in seconds
        timeout=datetime.timedelta(seconds=float(os.environ.get("LONGCA_TEST_GLOO_TIMEOUT_S", "180"))),
    )
    results = []
    kernel = rank_kernel("naive")
    dev = torch.device("cpu")
    seqlen = 64 if world == 8 else SEQLEN  # `document` balance cuts 4 x world equal chunks
    for mask_name in STATIC:
        mask = build_mask(mask_name, seqlen, small_params(mask_name, doc_file), seed=3)
        g = torch.Generator().manual_seed(11)
        q, dout = (torch.randn(BATCH, HQ, seqlen, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(2))
        k, v = (torch.randn(BATCH, HKV, seqlen, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(2))
        ref = reference_attention(q, k, v, mask.slices, dout)
        # World 2 crosses every balance with every case; worlds 4 and 8 rotate balances over masks
        # to keep CI time down (4 or 8 processes on 2 cores) while still running each balance there.
        balances = BALANCES if world == 2 else (BALANCES[STATIC.index(mask_name) % len(BALANCES)],)
        for balance in balances:
            sharding = make_sharding(balance, seqlen, world, mask.slices)
            pos = torch.from_numpy(sharding.positions(rank))
            for mech, degrees in CASES[world]:
                case = {"mask": mask_name, "balance": balance, "mechanism": mech, "degrees": degrees}
                try:
                    plan = build_plan(mech, degrees, mask.slices, sharding, rank, HQ, HKV, kernel, dev)
                    ql, kl, vl = (x[:, :, pos].clone().requires_grad_(True) for x in (q, k, v))
                    out = cp_attention(ql, kl, vl, plan)
                    out.backward(dout[:, :, pos])
                    errs = [relative_error(a, b[:, :, pos]) for a, b in zip((out, ql.grad, kl.grad, vl.grad), ref)]
                    t = torch.tensor(errs, dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    case["errors"] = t.tolist()
                    case["rank_areas"] = plan.rank_areas
                    case["area"] = mask.area
                except Exception:  # recorded, asserted in the parent
                    case["failure"] = traceback.format_exc()
                results.append(case)
    # FlexAttention local kernel at world size 2, forward and backward (its backward is Flex's own
    # backward operator on the combined out/LSE, run eagerly on the CPU: longca.kernels.flex_backward).
    if world == 2:
        flex = rank_kernel("flex")
        for mask_name in STATIC:
            mask = build_mask(mask_name, SEQLEN, small_params(mask_name, doc_file), seed=3)
            g = torch.Generator().manual_seed(12)
            q, dout = (torch.randn(BATCH, HQ, SEQLEN, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(2))
            k, v = (torch.randn(BATCH, HKV, SEQLEN, HEAD_DIM, generator=g, dtype=torch.float64) for _ in range(2))
            ref = reference_attention(q, k, v, mask.slices, dout)
            sharding = make_sharding("zigzag", SEQLEN, world, mask.slices)
            pos = torch.from_numpy(sharding.positions(rank))
            for mech in FLEX_MECHANISMS:
                case = {"mask": mask_name, "balance": "zigzag", "mechanism": mech, "degrees": None, "kernel": "flex"}
                try:
                    plan = build_plan(mech, None, mask.slices, sharding, rank, HQ, HKV, flex, dev)
                    ql, kl, vl = (x[:, :, pos].clone().requires_grad_(True) for x in (q, k, v))
                    out = cp_attention(ql, kl, vl, plan)
                    out.backward(dout[:, :, pos])
                    errs = [relative_error(a, b[:, :, pos]) for a, b in zip((out, ql.grad, kl.grad, vl.grad), ref)]
                    t = torch.tensor(errs, dtype=torch.float64)
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)
                    case.update(errors=t.tolist(), rank_areas=plan.rank_areas, area=mask.area)
                except Exception:
                    case["failure"] = traceback.format_exc()
                results.append(case)
    # The heads-do-not-divide error names heads and degree, identically on every rank.
    try:
        build_plan(
            "ulysses", None, mask.slices, make_sharding("zigzag", SEQLEN, world), rank, 3 * world // 2, 1, kernel, dev
        )
        results.append({"heads_error": None})
    except Unsupported as e:
        results.append({"heads_error": str(e)})
    if rank == 0:
        with open(result_file, "w") as f:
            json.dump(results, f)
    dist.barrier()
    rank_hits.save(os.path.dirname(result_file))  # for the mutation score (tests/support/rank_hits.py)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def doc_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("docs") / "small_docs.csv"
    path.write_text("low,high,weight\n3,20,1\n")
    return str(path)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_every_mechanism_and_mask_matches_reference(world: int, doc_file: str, tmp_path) -> None:
    result_file = str(tmp_path / "results.json")
    mp.start_processes(_worker, args=(world, free_port(), doc_file, result_file), nprocs=world, start_method="spawn")
    rank_hits.merge(tmp_path)
    results = json.load(open(result_file))
    heads = results.pop()
    assert heads["heads_error"] is not None and f"heads_q={3 * world // 2}" in heads["heads_error"]
    assert f"Ulysses degree {world}" in heads["heads_error"]
    failures = [r for r in results if "failure" in r or max(r["errors"]) > TOL]
    summary = [
        (r["mask"], r["balance"], r["mechanism"], r["degrees"], r.get("errors") or r["failure"][-300:])
        for r in failures
    ]
    assert not failures, f"{len(failures)} failing cases, first: {summary[:6]}"
    n_cases = len(STATIC) * (
        (len(BALANCES) * len(CASES[2]) + len(FLEX_MECHANISMS)) if world == 2 else len(CASES[world])
    )
    if world == 2:  # the Flex cases checked gradients too
        assert sum(len(r["errors"]) == 4 for r in results if r.get("kernel") == "flex") == len(STATIC) * len(
            FLEX_MECHANISMS
        )
    assert len(results) == n_cases
    for r in results:
        assert sum(r["rank_areas"]) == r["area"]  # per-rank areas (one batch element) add up


def test_degrees_are_resolved_or_rejected_with_the_allowed_values():
    from longca.cp.mechanisms import resolve_degrees

    assert resolve_degrees("ulysses", 4, None) == (4, 1, 1)
    assert resolve_degrees("ring_p2p", 4, {"ring": 4}) == (1, 4, 1)
    assert resolve_degrees("usp", 8, {"ulysses": 2, "ring": 4}) == (2, 4, 1)
    assert resolve_degrees("loongtrain", 8, {"ulysses": 2, "ring": 4, "windows": 2}) == (2, 4, 2)
    with pytest.raises(ValueError, match="ulysses=3 x ring=1 must multiply to world_size=4"):
        resolve_degrees("usp", 4, {"ulysses": 3, "ring": 1})
    with pytest.raises(ValueError, match=r"windows=3 must divide the ring degree 4; allowed: \[1, 2, 4\]"):
        resolve_degrees("loongtrain", 4, {"ring": 4, "windows": 3})
    with pytest.raises(ValueError, match="degrees.ring=2 does not fit mechanism 'ring_p2p'"):
        resolve_degrees("ring_p2p", 4, {"ring": 2})
    with pytest.raises(ValueError, match="unknown mechanism 'tree'; allowed"):
        resolve_degrees("tree", 4, None)


def test_kv_heads_are_replicated_only_when_fewer_than_the_degree():
    from longca.cp.ulysses import kv_replication

    assert kv_replication(64, 8, 2) == 1
    assert kv_replication(64, 8, 16) == 2
    assert kv_replication(8, 1, 8) == 8
    with pytest.raises(Unsupported, match="heads_kv=6 is not divisible by the Ulysses degree 4"):
        kv_replication(24, 6, 4)
    with pytest.raises(Unsupported, match="heads_kv=3 < Ulysses degree 4"):
        kv_replication(12, 3, 4)

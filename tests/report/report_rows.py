"""Synthetic result rows for the report tests and benchmark: TEST FIXTURES, not measurements.

Every figure below is invented to exercise the report (ok / unsupported / oom / error / incorrect,
sampled masks, sparse, context-parallel and linear rows); none describes a real kernel.
"""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from longca.store.schema import to_table

HOSTILE = '<script>alert("x")</script>&amp;'
DENSE_MASKS = ("full", "causal", "causal_document", "sliding_window", "share_question", "prefix_lm_causal")
SOFTMAX = ("sdpa", "flex", "fa_fixture")
ENV = dict(
    device="cuda",
    device_name="Fixture GPU (synthetic)",
    device_count=8,
    compute_capability="9.0",
    driver="000.00",
    cuda="12.x",
    torch="2.x",
    host="fixture-host",
    git_commit="0000000",
    longca_version="0.1.0",
    env_id="env-fixture",
    run_id="run-fixture",
    timestamp=datetime(2025, 1, 1, tzinfo=UTC),
    timer="cuda_events",
    spec="fixture",
)


def _cell(kernel: str, mask: str, pas: str, s: int, hq: int, hkv: int, **kw: Any) -> dict[str, Any]:
    cell_id = f"{kernel}/{mask}/{pas}/{s}/{hq}:{hkv}/" + "/".join(
        f"{k}={v}"
        for k, v in sorted(kw.items())
        if k in ("density", "block_size", "score_source", "world_size", "cp_mechanism", "head_dim", "dtype")
    )
    row = dict(
        ENV,
        kernel=kernel,
        mask=mask,
        **{"pass": pas},
        seqlen_q=s,
        seqlen_k=s,
        batch=1,
        heads_q=hq,
        heads_kv=hkv,
        head_dim=128,
        head_dim_v=128,
        dtype="bf16",
        layout="bshd",
        cell_id=cell_id,
        world_size=1,
        kernel_family="softmax",
        mask_samples=1,
        mask_sample=0,
    )
    row.update(kw)
    return row


def _timed(row: dict[str, Any], tflops: float, rng: random.Random) -> dict[str, Any]:
    area = row["seqlen_q"] * row["seqlen_k"] * (0.5 if "causal" in row["mask"] else 1.0) * row.get("density", 1.0)
    flops = 4 * area * row["heads_q"] * row["head_dim"] * (2.5 if row["pass"] == "bwd" else 1.0)
    ms = flops / (tflops * 1e12) * 1e3
    samples = [ms * (1 + 0.02 * rng.random()) for _ in range(5)]
    return dict(
        row,
        status="ok",
        flops=flops,
        tflops=tflops,
        median_ms=ms,
        p20_ms=ms * 0.99,
        p80_ms=ms * 1.01,
        samples_ms=samples,
        mask_area=int(area),
        peak_mem_bytes=int(row["seqlen_q"] * 4096 * (1 + rng.random())),
        tokens_per_s=row["batch"] * row["seqlen_q"] / (ms / 1e3),
        rel_err_out=1e-3,
        backend="fixture",
    )


def synthetic_rows(
    samples: int = 2,
    seqlens: tuple[int, ...] = (1024, 4096, 16384, 65536),
    head_dims: tuple[int, ...] = (128,),
    masks: tuple[str, ...] = DENSE_MASKS,
    kernels: tuple[str, ...] = SOFTMAX,
    seed: int = 0,
) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for kernel, mask, pas, s, (hq, hkv), d in itertools.product(
        kernels, masks, ("fwd", "bwd"), seqlens, ((64, 8), (16, 16)), head_dims
    ):
        n = samples if "document" in mask or mask in ("share_question", "prefix_lm_causal") else 1
        for i in range(n):
            row = _cell(kernel, mask, pas, s, hq, hkv, head_dim=d, head_dim_v=d, mask_sample=i, mask_samples=n, seed=i)
            if kernel == "fa_fixture" and mask in ("share_question", "prefix_lm_causal"):
                rows.append(dict(row, status="unsupported", reason="mask form not in capabilities"))
            elif kernel == "sdpa" and s == max(seqlens) and pas == "bwd":
                rows.append(dict(row, status="oom", reason="CUDA out of memory (fixture)"))
            elif kernel == "flex" and mask == "sliding_window" and s == seqlens[1] and i == 0:
                rows.append(dict(row, status="incorrect", reason="rel_err_out 0.4 > 0.02 (fixture)"))
            elif kernel == "flex" and mask == "causal_document" and s == seqlens[0] and i == samples - 1:
                rows.append(dict(row, status="error", reason="RuntimeError: fixture failure " + HOSTILE))
            else:
                base = {"sdpa": 300, "flex": 250, "fa_fixture": 400}.get(kernel, 200)
                frac = 1.0 if mask == "full" else 0.8
                timed = _timed(row, base * frac * (1 - 0.5 / (1 + s / 4096)) * (1 + 0.05 * rng.random()), rng)
                if kernel == "flex" and s == seqlens[0]:  # replayed from a CUDA graph: 0.4 of its eager time
                    g = timed["median_ms"] * 0.4
                    timed.update(graph_median_ms=g, graph_ci_low_ms=g * 0.995, graph_ci_high_ms=g * 1.005)
                rows.append(timed)
    # a head-dim and dtype study at one length, beside the D=128 bf16 lines above
    for kernel, mask, pas, (d, dtype) in itertools.product(
        SOFTMAX, ("full", "causal"), ("fwd", "bwd"), ((64, "bf16"), (256, "bf16"), (128, "fp16"))
    ):
        if kernel == "fa_fixture" and d == 256 and pas == "bwd":
            rows.append(
                dict(
                    _cell(kernel, mask, pas, seqlens[2], 64, 8, head_dim=d, head_dim_v=d, dtype=dtype),
                    status="unsupported",
                    reason="head dim 256 backward (fixture)",
                )
            )
            continue
        row = _cell(kernel, mask, pas, seqlens[2], 64, 8, head_dim=d, head_dim_v=d, dtype=dtype)
        base = {"sdpa": 300, "flex": 250, "fa_fixture": 400}[kernel]
        rows.append(_timed(row, base * (d / 128) ** 0.3 * (0.8 if mask == "causal" else 1.0), rng))
    for kernel, mask, pas, s, density, bs, src in itertools.product(
        ("flex", "triton_bs"),
        ("block_sparse", "variable_block_sparse"),
        ("fwd", "bwd"),
        seqlens,
        (0.2, 0.5, 0.8),
        (64, 128),
        ("random", "importance"),
    ):
        row = _cell(
            kernel,
            mask,
            pas,
            s,
            64,
            8,
            density=density,
            block_size=bs,
            score_source=src,
            variable_blocks=mask.startswith("variable"),
            mask_family="dynamic",
        )
        rows.append(_timed(row, 150 + 200 * density * bs / 128 * (1 + 0.05 * rng.random()), rng))
    for mech, ws, s, mask in itertools.product(("ring", "ulysses", "usp"), (2, 4, 8), seqlens, ("full", "causal")):
        row = _cell(
            "flex",
            mask,
            "fwd",
            s * ws,
            64,
            8,
            world_size=ws,
            cp_mechanism=mech,
            cp_degrees={mech: ws},
            cp_balance="zigzag",
        )
        r = _timed(row, 200 / (1 + 0.05 * ws) * (1 + 0.05 * rng.random()), rng)
        r["rank_ms"] = [r["median_ms"] * (0.8 + 0.4 * rng.random()) for _ in range(ws)]
        r["rank_area"] = [int(r["mask_area"] / ws * (0.9 + 0.2 * rng.random())) for _ in range(ws)]
        r["comm_exposed_ms"] = r["median_ms"] * 0.05 * ws
        rows.append(r)
    rows.append(
        dict(
            _cell("flex", "causal", "fwd", 4096 * 16, 64, 8, world_size=16, cp_mechanism="ring"),
            status="error",
            reason="NCCL timeout (fixture)",
        )
    )
    # a kernel name that is HTML: every page must show it as text
    rows.append(dict(_cell(HOSTILE, "full", "fwd", seqlens[0], 64, 8), status="error", reason="fixture " + HOSTILE))
    for kernel, s in itertools.product(("gla_fixture",), seqlens):
        row = _cell(kernel, "causal", "fwd", s, 64, 8, kernel_family="linear", flop_model="linear_gla")
        ms = s / 2e6 * 1e3  # linear: time proportional to length
        rows.append(
            dict(
                row,
                status="ok",
                median_ms=ms,
                p20_ms=ms,
                p80_ms=ms,
                tokens_per_s=s / (ms / 1e3),
                peak_mem_bytes=s * 1000,
            )
        )
    return rows


def synthetic_table(**kw: Any) -> pa.Table:
    return to_table(synthetic_rows(**kw))


def ok_row(**kw) -> dict:
    """An ok row of a 1K full-mask cell on one device; `kw` overrides."""
    row = dict(
        spec="s",
        kernel="k",
        mask="full",
        seqlen_q=1024,
        seqlen_k=1024,
        batch=1,
        heads_q=8,
        heads_kv=8,
        head_dim=64,
        dtype="bf16",
        status="ok",
        tflops=1.0,
        median_ms=1.0,
        device_name="dev",
        host="h",
        world_size=1,
    )
    return {**row, **kw}


def write_one_row(path) -> None:
    """One ok single-GPU row as Parquet: the least a report can be built from (tests of its pages'
    side tables)."""
    import pyarrow.parquet as pq

    pq.write_table(to_table([ok_row(sweep="w", samples_ms=[1.0], cell_wall_s=2.0)]), path)

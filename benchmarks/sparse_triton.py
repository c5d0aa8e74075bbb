"""Throughput of longca's Triton block-sparse attention against dense cuDNN SDPA on the same shape.

    python benchmarks/sparse_triton.py OUTDIR [--budget-s 170] [--no-tune] [--no-check] [--tune-only]
        [--seqlens 16384,32768,65536,131072] [--variants fwd_kernel=tma "fwd_kernel=tma_ws;fwd=128,128,4,2"]

Phases (each row lands in OUTDIR/sparse_triton.json and .csv):
1. check: forward and gradients against the float32 reference (benchmarks/sparse_check.py cases);
2. tune: a few (BLOCK_M, BLOCK_N, warps, stages) per pass for sm90, at 32K, 16:2 heads, density 0.5,
   separately for block 128 and 64; the best per block is used below;
3. headline: 64K, GQA 64:8, D 128, block 128, density 0.5 (the >= 80 % of cuDNN goal);
   with --variants, also the forward of the block-128 config and of each variant (config text laid
   over it, e.g. a forward kernel variant with its own tiles), each checked first (phase `variants`);
4. sweep: block 64/128 x density 0.2/0.5/0.8 x S 16K..128K x GQA (group 8) and MHA, forward and
   backward; query heads shrink as (16K / S)^2 so every cell costs about the same (GQA keeps >= 8:1);
   plus variable blocks (min 64, mean 128) at 32K.
Every sparse cell's forward is checked on sampled query rows against a float32 reference (exact
mask rows, all keys); a cell above tolerance is `incorrect` and gets no speed.
FLOPs: 4 * kept area * Hq * D forward (exact kept-block area, ragged blocks included), 2.5x backward;
dense cuDNN: 4 * S^2 * Hq * D. Timing: CUDA events, median of 3-20 iterations after a warm-up.
When the budget runs out the remaining cells are written as `skipped_budget`.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sparse_check  # noqa: E402

from longca.kernels.triton_sparse.api import block_sparse_attention, block_sparse_attn_fwd  # noqa: E402
from longca.kernels.triton_sparse.configs import default_config, parse_config  # noqa: E402
from longca.kernels.triton_sparse.forward import uses_tma  # noqa: E402
from longca.kernels.triton_sparse.plan import KernelConfig, TileConfig, build_plan, tile_sizes  # noqa: E402
from longca.masks.blocks import BlockLayout  # noqa: E402
from longca.measure.flops import attention_flops  # noqa: E402
from longca.measure.reference import relative_error  # noqa: E402

D = 128
DTYPE = torch.bfloat16
FWD_TOL = 3e-2
FWD_CANDIDATES = [
    TileConfig(128, 64, 4, 3),
    TileConfig(128, 64, 8, 3),
    TileConfig(128, 128, 8, 2),
    TileConfig(128, 128, 8, 3),
    TileConfig(64, 64, 4, 3),
    TileConfig(64, 64, 4, 4),
    TileConfig(128, 64, 8, 4),
    TileConfig(64, 128, 4, 2),
    TileConfig(128, 128, 4, 2),
    TileConfig(64, 64, 4, 2),
]
DKDV_CANDIDATES = [
    TileConfig(32, 128, 4, 3),
    TileConfig(64, 128, 8, 3),
    TileConfig(32, 64, 4, 3),
    TileConfig(64, 64, 4, 2),
    TileConfig(16, 128, 4, 4),
    TileConfig(32, 128, 8, 4),
]
DQ_CANDIDATES = [
    TileConfig(128, 32, 4, 3),
    TileConfig(64, 64, 4, 3),
    TileConfig(128, 64, 8, 3),
    TileConfig(64, 32, 4, 2),
    TileConfig(128, 32, 8, 4),
]


class Clock:
    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.perf_counter(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.t0)


def bench(fn, target_s: float = 0.3, min_iters: int = 3, max_iters: int = 20) -> tuple[float, int]:
    """Median milliseconds of fn over CUDA events, after a warm-up call (which compiles); stops
    after max_iters or once min_iters ran and target_s of GPU time was spent."""
    fn()
    torch.cuda.synchronize()
    times: list[float] = []
    while len(times) < max_iters and (len(times) < min_iters or sum(times) < target_s * 1e3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times)), len(times)


def layout_for(seqlen: int, block, heads_kv: int, density: float, seed: int) -> BlockLayout:
    return sparse_check.make_layout(seqlen, block, heads_kv, density, np.random.default_rng(seed))


def inputs(heads_q: int, heads_kv: int, seqlen: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda h: torch.randn(1, h, seqlen, D, device="cuda", dtype=DTYPE, generator=gen)  # noqa: E731
    return mk(heads_q), mk(heads_kv), mk(heads_kv), mk(heads_q)


def sampled_forward_error(q, k, v, out, lse, layout: BlockLayout, rows: int = 64) -> float:
    """Relative error of out on `rows` sampled query rows vs float32 attention over all keys."""
    s, hq, hkv = q.shape[2], q.shape[1], k.shape[1]
    g = hq // hkv
    idx = torch.as_tensor(np.random.default_rng(0).choice(s, size=min(rows, s), replace=False), device=q.device)
    qblk = np.searchsorted(layout.q_bounds, idx.cpu().numpy(), side="right") - 1
    ksizes = torch.as_tensor(np.diff(layout.k_bounds), device=q.device)
    got, want = [], []
    for h in range(hkv):
        allowed = torch.as_tensor(layout.kept[h][qblk], device=q.device).repeat_interleave(ksizes, dim=1)
        qs = q[0, h * g : (h + 1) * g, idx].float()  # (g, R, D)
        sc = (qs @ k[0, h].float().T) / D**0.5
        sc = sc.masked_fill(~allowed, float("-inf"))
        want.append(torch.softmax(sc, -1).nan_to_num(0.0) @ v[0, h].float())
        got.append(out[0, h * g : (h + 1) * g, idx])
    return relative_error(torch.stack(got), torch.stack(want))


def dense_cudnn(heads_q: int, heads_kv: int, seqlen: int) -> dict:
    """Dense (no mask) cuDNN SDPA forward and backward on the same shape."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    q, k, v, do = inputs(heads_q, heads_kv, seqlen)
    row = {
        "kernel": "sdpa_cudnn_dense",
        "seqlen": seqlen,
        "heads_q": heads_q,
        "heads_kv": heads_kv,
        "block": None,
        "density": 1.0,
    }
    gqa_repeat = False

    def fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            if gqa_repeat:
                return sdpa(q, k.repeat_interleave(heads_q // heads_kv, 1), v.repeat_interleave(heads_q // heads_kv, 1))
            return sdpa(q, k, v, enable_gqa=heads_q != heads_kv)

    try:
        with torch.no_grad():
            fwd()
    except RuntimeError:
        gqa_repeat = True  # cuDNN refused enable_gqa: same FLOPs with K/V repeated to Hq heads
    row["gqa_via_repeat"] = gqa_repeat
    with torch.no_grad():
        ms, n = bench(fwd)
    flops = attention_flops(seqlen * seqlen, heads_q, D, "fwd")
    rows = [{**row, "pass": "fwd", "ms": ms, "iters": n, "tflops": flops / ms / 1e9, "status": "ok"}]
    qkv = [t.clone().requires_grad_() for t in (q, k, v)]
    q, k, v = qkv
    out = fwd()
    ms, n = bench(lambda: torch.autograd.grad(out, qkv, do, retain_graph=True))
    flops = attention_flops(seqlen * seqlen, heads_q, D, "bwd")
    rows.append({**row, "pass": "bwd", "ms": ms, "iters": n, "tflops": flops / ms / 1e9, "status": "ok"})
    return rows


def sparse_cell(
    layout: BlockLayout, heads_q: int, config: KernelConfig, passes=("fwd", "bwd"), check=True
) -> list[dict]:
    s, hkv = int(layout.q_bounds[-1]), layout.heads
    base = {
        "kernel": "triton_block_sparse",
        "seqlen": s,
        "heads_q": heads_q,
        "heads_kv": hkv,
        "block": layout.uniform_block or "var",
        "density": float(layout.kept.mean()),
    }  # actual kept fraction
    t0 = time.perf_counter()
    plan = build_plan(layout, "cuda", config)
    torch.cuda.synchronize()
    base.update(
        build_s=round(time.perf_counter() - t0, 3), tiles=json.dumps(plan.config.as_dict()), fast_path=plan.fast_path
    )
    area = float(layout.area_per_head().mean())
    q, k, v, do = inputs(heads_q, hkv, s)
    if config.fwd_kernel != "ptr":  # which forward ran: the TMA kernel or its pointer fallback
        base.update(fwd_kernel=config.fwd_kernel, fwd_tma=uses_tma(plan, q, k, v))
    rows = []
    if check:
        out, lse = block_sparse_attn_fwd(q, k, v, plan)
        err = sampled_forward_error(q, k, v, out, lse, layout)
        base["rel_err_out_sampled"] = err
        if not err <= FWD_TOL:
            return [{**base, "pass": p, "status": "incorrect"} for p in passes]
        del out, lse
    if "fwd" in passes:
        ms, n = bench(lambda: block_sparse_attn_fwd(q, k, v, plan))
        rows.append(
            {
                **base,
                "pass": "fwd",
                "ms": ms,
                "iters": n,
                "status": "ok",
                "tflops": attention_flops(area, heads_q, D, "fwd") / ms / 1e9,
            }
        )
    if "bwd" in passes:
        qkv = [t.clone().requires_grad_() for t in (q, k, v)]
        out = block_sparse_attention(*qkv, plan)
        ms, n = bench(lambda: torch.autograd.grad(out, qkv, do, retain_graph=True))
        rows.append(
            {
                **base,
                "pass": "bwd",
                "ms": ms,
                "iters": n,
                "status": "ok",
                "tflops": attention_flops(area, heads_q, D, "bwd") / ms / 1e9,
            }
        )
    return rows


def tune(block: int, clock: Clock, log: list[dict]) -> KernelConfig:
    """Best fwd, then dK/dV (dQ at default), then dQ config at 32K, 16:2, density 0.5."""
    layout = layout_for(32768, block, 2, 0.5, seed=1)
    best = default_config(D, block)

    def distinct(cands):
        seen, out = set(), []
        for c in cands:
            m, n = tile_sizes(layout, c)
            eff = TileConfig(m, n, c.num_warps, c.num_stages)
            if eff not in seen:
                seen.add(eff)
                out.append(eff)
        return out

    for pass_, field, cands in (
        ("fwd", "fwd", FWD_CANDIDATES),
        ("bwd", "dkdv", DKDV_CANDIDATES),
        ("bwd", "dq", DQ_CANDIDATES),
    ):
        scores = []
        for c in distinct(cands):
            if clock.left() < 30:
                break
            cfg = replace(best, **{field: c})
            try:
                row = sparse_cell(layout, 16, cfg, passes=(pass_,), check=(field == "fwd"))[0]
            except Exception as exc:  # e.g. out of shared memory for this tile shape
                row = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}
            row.update(
                phase="tune", tuned=field, candidate=[c.block_m, c.block_n, c.num_warps, c.num_stages], tune_block=block
            )
            log.append(row)
            print(json.dumps(row), flush=True)
            if row.get("status") == "ok":
                scores.append((row["ms"], c))
        if scores:
            best = replace(best, **{field: min(scores, key=lambda x: x[0])[1]})
    return best


def heads_for(seqlen: int, kind: str) -> tuple[int, int]:
    hq = max(1, int(64 * (16384 / seqlen) ** 2))
    if kind == "gqa":
        hq = max(8, hq)
        return hq, hq // 8
    return hq, hq


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--budget-s", type=float, default=170.0)
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--tune-only", action="store_true", help="stop after tuning and the 64K headline")
    ap.add_argument("--seqlens", default="16384,32768,65536,131072")
    ap.add_argument(
        "--variants",
        nargs="*",
        default=[],
        metavar="CONFIG",
        help="headline forward variants: config texts over the block-128 config, e.g. "
        "'fwd_kernel=tma' or 'fwd_kernel=tma_ws;fwd=128,128,4,2'",
    )
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.budget_s)
    import triton

    env = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "head_dim": D,
        "dtype": str(DTYPE),
    }
    print(json.dumps(env), flush=True)
    rows: list[dict] = []
    check_rows = [] if args.no_check else sparse_check.run_cases()
    for text in args.variants:
        parse_config(text)  # fail on a typo before any GPU time is spent
    configs = {b: default_config(D, b) for b in (128, 64)}
    if not args.no_tune:
        for b in (128, 64):
            configs[b] = tune(b, clock, rows)
    tuned = {b: c.as_dict() for b, c in configs.items()}
    print("tuned", json.dumps(tuned), flush=True)

    def record(new: list[dict], phase: str):
        for r in new:
            r["phase"] = phase
            print(json.dumps(r), flush=True)
        rows.extend(new)

    # headline: the goal shape
    if clock.left() > 20:
        dense = dense_cudnn(64, 8, 65536)
        layout = layout_for(65536, 128, 8, 0.5, seed=2)
        dense_tflops = {x["pass"]: x.get("tflops") for x in dense}

        def vs_dense(rows_: list[dict]) -> list[dict]:
            for r in rows_:
                r["vs_dense_cudnn"] = r["tflops"] / dense_tflops[r["pass"]] if r.get("status") == "ok" else None
            return rows_

        sparse = vs_dense(sparse_cell(layout, 64, configs[128]))
        record(dense + sparse, "headline")
        # forward variants against the same dense row, the tuned config first as the baseline
        variants = [parse_config(t, configs[128]) for t in args.variants]
        for cfg in [configs[128]] + variants if variants else []:
            base = {
                "seqlen": 65536,
                "heads_q": 64,
                "heads_kv": 8,
                "block": 128,
                "density": 0.5,
                "variant": cfg.as_text(),
            }
            if clock.left() < 20:
                record([{**base, "status": "skipped_budget"}], "variants")
                continue
            try:
                new = sparse_cell(layout, 64, cfg, passes=("fwd",))
            except Exception as exc:  # e.g. a variant that does not compile with this Triton
                new = [{**base, "status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}]
            for r in new:
                r["variant"] = base["variant"]
            torch.cuda.empty_cache()
            record(vs_dense(new), "variants")

    plan = []
    for s in [] if args.tune_only else (int(x) for x in args.seqlens.split(",")):
        for kind in ("gqa", "mha"):
            hq, hkv = heads_for(s, kind)
            plan.append(("dense", s, hq, hkv, None, None))
            for block in (128, 64):
                for density in (0.2, 0.5, 0.8):
                    plan.append(("sparse", s, hq, hkv, block, density))
        if s == 32768:
            plan.append(("sparse", s, 16, 2, "var", 0.5))
    dense_by_shape: dict = {}
    for i, (what, s, hq, hkv, block, density) in enumerate(plan):
        base = {"seqlen": s, "heads_q": hq, "heads_kv": hkv, "block": block, "density": density}
        if clock.left() < 5:
            record([{**base, "status": "skipped_budget"}], "sweep")
            continue
        try:
            if what == "dense":
                new = dense_cudnn(hq, hkv, s)
                dense_by_shape[(s, hq, hkv)] = {r["pass"]: r["tflops"] for r in new}
            else:
                cfg = configs[128] if block == "var" else configs[block]
                new = sparse_cell(layout_for(s, block, hkv, density, seed=i), hq, cfg)
                ref = dense_by_shape.get((s, hq, hkv), {})
                for r in new:
                    if r.get("status") == "ok" and r["pass"] in ref:
                        r["vs_dense_cudnn"] = r["tflops"] / ref[r["pass"]]
        except torch.cuda.OutOfMemoryError:
            new = [{**base, "status": "oom"}]
        except Exception as exc:
            new = [{**base, "status": "error", "error": f"{type(exc).__name__}: {exc}"[:300]}]
        torch.cuda.empty_cache()
        record(new, "sweep")

    (args.outdir / "sparse_triton.json").write_text(
        json.dumps({"env": env, "tuned": tuned, "check": check_rows, "rows": rows}, indent=1, default=str)
    )
    keys = sorted({k for r in rows for k in r})
    with open(args.outdir / "sparse_triton.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(
        f"{'phase':9} {'kernel':20} {'S':>7} {'heads':>6} {'block':>5} {'dens':>5} {'pass':4} {'TFLOP/s':>8} {'vs cuDNN':>8}"
    )
    for r in rows:
        if r.get("phase") == "tune":
            continue
        tf = f"{r['tflops']:.0f}" if r.get("tflops") else r.get("status", "")
        vs = f"{r['vs_dense_cudnn']:.2f}" if r.get("vs_dense_cudnn") else ""
        print(
            f"{r.get('phase', ''):9} {r.get('kernel', ''):20} {r['seqlen']:>7} {r['heads_q']}:{r['heads_kv']:<3} "
            f"{str(r.get('block') or ''):>5} {r.get('density') or 0:>5.2f} {r.get('pass', ''):4} {tf:>8} {vs:>8}"
        )
    print(f"total {args.budget_s - clock.left():.0f} s")
    return 0 if all(r.get("ok") for r in check_rows) else 1


if __name__ == "__main__":
    sys.exit(main())

"""GPU correctness of longca's Triton block-sparse attention: forward output and dq, dk, dv against
the float32 dense-mask reference (longca.measure.reference) on the same inputs, at moderate sizes
covering block 64 / 128 / 48, variable blocks, a short last block, GQA and MHA, head dim 64 / 128 /
256, fp16 and bf16, and query blocks with no kept key block.

    python benchmarks/sparse_check.py OUTDIR        # writes OUTDIR/sparse_check.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from longca.kernels.triton_sparse.api import block_sparse_attention
from longca.kernels.triton_sparse.configs import default_config
from longca.kernels.triton_sparse.plan import KernelConfig, build_plan
from longca.masks import block_sparse as bs
from longca.masks.blocks import BlockLayout
from longca.masks.mask import Mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error

TOLERANCE = {"bfloat16": 3e-2, "float16": 1e-2}  # as the default spec; gradients 3x
GRAD_FACTOR = 3.0

# (seqlen, block | "var", heads_q, heads_kv, head_dim, dtype, density, empty query-block rows)
CASES = [
    (2048, 128, 8, 2, 128, "bfloat16", 0.5, 0),
    (2048, 64, 8, 2, 128, "bfloat16", 0.3, 2),
    (2048, 128, 4, 4, 64, "float16", 0.5, 0),
    (2048, "var", 8, 2, 128, "bfloat16", 0.5, 1),
    (2000, 64, 4, 1, 128, "bfloat16", 0.5, 0),  # short last block: masked path
    (1024, 48, 4, 2, 64, "bfloat16", 0.5, 0),  # block 48: 16-wide tiles
    (1024, 128, 4, 2, 256, "bfloat16", 0.5, 0),
]


def make_layout(seqlen: int, block, heads_kv: int, density: float, rng: np.random.Generator) -> BlockLayout:
    if block == "var":
        bounds, uniform = bs.variable_bounds(seqlen, 64, 128, rng), None
    else:
        bounds, uniform = bs.uniform_bounds(seqlen, block), block
    n = len(bounds) - 1
    return bs.top_k_layout(bs.random_scores(heads_kv, n, n, rng), bounds, bounds, density, uniform)


def check(
    layout: BlockLayout, heads_q: int, head_dim: int, dtype: str, config: KernelConfig | None = None, seed: int = 0
) -> dict:
    """Relative errors of out, dq, dk, dv vs the float32 reference; `ok` against TOLERANCE."""
    dt = getattr(torch, dtype)
    s, hkv = int(layout.q_bounds[-1]), layout.heads
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(1, heads_q, s, head_dim, device="cuda", dtype=dt, generator=gen) for _ in range(2))
    k, v = (torch.randn(1, hkv, s, head_dim, device="cuda", dtype=dt, generator=gen) for _ in range(2))
    plan = build_plan(layout, "cuda", config or default_config(head_dim))
    qkv = [t.clone().requires_grad_() for t in (q, k, v)]
    out = block_sparse_attention(*qkv, plan)
    grads = torch.autograd.grad(out, qkv, do)
    mask = Mask(name="block_sparse", seqlen_q=s, seqlen_k=s, slices=np.zeros((0, 5), np.int64), blocks=layout)
    dense = dense_mask_tensor(mask, torch.device("cuda"))
    ref_in = [t.float().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]  # bshd
    ref = reference_attention(*ref_in, dense)
    ref_grads = torch.autograd.grad(ref, ref_in, do.float().transpose(1, 2))
    err = {"out": relative_error(out, ref.transpose(1, 2))}
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        err[name] = relative_error(g, r.transpose(1, 2))
    tol = TOLERANCE[dtype]
    ok = err["out"] <= tol and all(err[n] <= tol * GRAD_FACTOR for n in ("dq", "dk", "dv"))
    return {"rel_err": err, "ok": bool(ok), "fast_path": plan.fast_path, "tiles": plan.config.as_dict()}


def run_cases(cases=CASES) -> list[dict]:
    rows = []
    for i, (s, block, hq, hkv, d, dtype, density, empty) in enumerate(cases):
        rng = np.random.default_rng(i)
        layout = make_layout(s, block, hkv, density, rng)
        kept = layout.kept.copy()
        kept[0, :empty] = False  # query blocks with no key block: zero output, no NaN
        layout = BlockLayout(layout.q_bounds, layout.k_bounds, kept, layout.uniform_block)
        t0 = time.perf_counter()
        try:
            res = check(layout, hq, d, dtype, seed=i)
        except Exception as exc:  # record and go on: one failing case must not hide the others
            res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        row = {
            "seqlen": s,
            "block": block,
            "heads_q": hq,
            "heads_kv": hkv,
            "head_dim": d,
            "dtype": dtype,
            "density": density,
            "empty_rows": empty,
            "seconds": round(time.perf_counter() - t0, 2),
            **res,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    rows = run_cases()
    (out / "sparse_check.json").write_text(json.dumps(rows, indent=1))
    bad = [r for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} cases correct")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Check longca's FlexAttention BlockMasks on a device: compiled flex_attention, forward and gradients.

For every mask (default: all 14) at a small length it compares compiled flex_attention with the
BlockMask from longca.masks.flex.to_block_mask against a float64 softmax reference with the dense
mask (relative errors of out, dq, dk, dv; forward only on CPU, where FlexAttention has no backward); at each long length it builds the BlockMask on the
device, runs one compiled forward + backward and reports build time and peak memory.

    python benchmarks/masks_flex_check.py --device cuda [--check-seqlen 2048] [--long 131072 524288]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch._dynamo


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(
        torch.linalg.vector_norm(a.double() - b.double()) / torch.linalg.vector_norm(b.double()).clamp_min(1e-30)
    )


def main() -> int:
    from torch.nn.attention.flex_attention import flex_attention

    from longca.masks.flex import to_block_mask
    from longca.masks.registry import PATTERNS, build_mask

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--check-seqlen", type=int, default=2048)
    ap.add_argument("--long", type=int, nargs="*", default=[131072])
    ap.add_argument("--heads", default="8:2", help="query:kv heads")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--masks", nargs="*", default=None)
    args = ap.parse_args()
    hq, hkv = (int(x) for x in args.heads.split(":"))
    dtype = getattr(torch, args.dtype)
    dev = torch.device(args.device)
    # One compile per (mask_mod, shape): past dynamo's default recompile limit it would silently fall
    # back to eager flex_attention, which materialises S x S scores.
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 4096)
    flex = torch.compile(flex_attention, dynamic=False)
    small = {
        "sliding_window": {"window": 128},
        "causal_sliding_window": {"window": 128},
        "block_causal_document": {"block": 256},
    }
    ok = True
    for name in args.masks or list(PATTERNS):
        dyn = PATTERNS[name].family == "dynamic"
        for S in [args.check_seqlen, *args.long]:
            params = small.get(name, {}) if S == args.check_seqlen else {}
            g = torch.Generator(device="cpu").manual_seed(0)
            grad = dev.type != "cpu"  # FlexAttention has no backward on CPU
            q = torch.randn(1, hq, S, args.head_dim, generator=g).to(dev, dtype).requires_grad_(grad)
            k = torch.randn(1, hkv, S, args.head_dim, generator=g).to(dev, dtype).requires_grad_(grad)
            v = torch.randn(1, hkv, S, args.head_dim, generator=g).to(dev, dtype).requires_grad_(grad)
            mask = build_mask(name, S, params, seed=0, heads_kv=hkv if dyn else None)
            if dev.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            bm = to_block_mask(mask, 128, device=dev, heads_q=hq if dyn else None)
            build_s = time.perf_counter() - t
            row = {"mask": name, "seqlen": S, "build_s": round(build_s, 3), "density": round(mask.density, 5)}
            try:
                out = flex(q, k, v, block_mask=bm, enable_gqa=True)
                if grad:
                    out.backward(torch.ones_like(out))
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                    row["peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
                if S == args.check_seqlen:
                    qr, kr, vr = (x.detach().double().requires_grad_() for x in (q, k, v))
                    dense = torch.as_tensor(mask.dense(), device=dev)
                    dense = dense.repeat_interleave(hq // dense.shape[0], 0) if dense.dim() == 3 else dense
                    group = hq // hkv
                    s = qr @ kr.repeat_interleave(group, 1).transpose(-1, -2) / args.head_dim**0.5
                    ref = torch.softmax(s.masked_fill(~dense, float("-inf")), -1) @ vr.repeat_interleave(group, 1)
                    row["err_out"] = rel(out, ref)
                    if grad:
                        ref.backward(torch.ones_like(ref))
                        row.update(
                            err_dq=rel(q.grad, qr.grad), err_dk=rel(k.grad, kr.grad), err_dv=rel(v.grad, vr.grad)
                        )
                    tol = 3e-2 if dtype in (torch.bfloat16, torch.float16) else 1e-4
                    row["correct"] = all(
                        row[key] < tol * (3 if key != "err_out" else 1)
                        for key in ("err_out", "err_dq", "err_dk", "err_dv")
                        if key in row
                    )
                    ok &= row["correct"]
            except torch.OutOfMemoryError as exc:
                row["status"] = f"oom: {str(exc).splitlines()[0]}"
            print(json.dumps(row), flush=True)
            del q, k, v, bm
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

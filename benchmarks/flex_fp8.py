"""Does compiled FlexAttention run an fp8 (float8_e4m3fn) forward on this GPU, how accurately, how fast?

A probe before fp8 becomes a spec dtype: for each mask and head dim, q, k, v are drawn N(0, 1) in
float32 and rounded to e4m3 (no scaling: N(0, 1) lies well inside e4m3's +-448), Flex runs on them
through longca's adapter, and the output is compared with the float32 reference on the *rounded*
inputs (the kernel's error alone) and on the unrounded ones (with the input rounding). The floor
line is the reference's own output rounded to e4m3 (Flex returns the query's dtype). Then both
dtypes are timed on the same problem with CUDA events (median of `--iters` calls after warm-ups,
no L2 flush: this is a probe, the pipeline measures the published rows). One JSON line per case.

    python benchmarks/flex_fp8.py [--seqlens 4096 16384] [--head-dims 64 128 256] [--masks full causal]
"""

from __future__ import annotations

import argparse
import json
import statistics
import traceback

import torch

F8 = torch.float8_e4m3fn


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def median_ms(fn, warmup: int, iters: int) -> float:
    if not torch.cuda.is_available():
        return float("nan")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def case(mask_name: str, seqlen: int, head_dim: int, args: argparse.Namespace, dev: torch.device) -> dict:
    from longca.kernels.registry import get
    from longca.masks.registry import build_mask
    from longca.measure.flops import attention_flops
    from longca.measure.reference import dense_mask_tensor, reference_attention

    hq, hkv = (int(x) for x in args.heads.split(":"))
    mask = build_mask(mask_name, seqlen, seed=0)
    flex = get("flex")
    g = torch.Generator(device=dev).manual_seed(0)
    raw = [torch.randn(1, seqlen, h, head_dim, generator=g, device=dev) for h in (hq, hkv, hkv)]  # bshd
    row = {"mask": mask_name, "seqlen": seqlen, "head_dim": head_dim, "heads": args.heads}
    out = {}
    for name, dtype in (("fp8", F8), ("bf16", torch.bfloat16)):
        prepared = flex.prepare(
            mask,
            batch=1,
            heads_q=hq,
            heads_kv=hkv,
            head_dim=head_dim,
            dtype=dtype,
            device=dev,
            form="blockmask",
            grad=False,
        )
        q, k, v = (x.to(dtype).transpose(1, 2).contiguous() for x in raw)
        with torch.no_grad():
            try:
                o = prepared.call(q, k, v)
            except Exception as exc:  # noqa: BLE001 - a probe reports what failed
                row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                continue
            out[name] = o
            row[f"{name}_out_dtype"] = str(o.dtype)
            ms = median_ms(lambda: prepared.call(q, k, v), args.warmup, args.iters)
        flops = attention_flops(mask.area_per_head, hq, head_dim, "fwd")
        row[f"{name}_ms"] = round(ms, 4)
        row[f"{name}_tflops"] = round(flops / ms / 1e9, 1)
    if seqlen <= args.check_max and "fp8" in out:
        dense = dense_mask_tensor(mask, dev)
        prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            rounded = [x.to(F8).float() for x in raw]
            ref_rounded = reference_attention(*rounded, dense)
            ref_raw = reference_attention(*raw, dense)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = prev
        fp8_out = out["fp8"].transpose(1, 2).float()
        row["rel_err_vs_rounded_inputs"] = rel(fp8_out, ref_rounded)
        row["rel_err_vs_raw_inputs"] = rel(fp8_out, ref_raw)
        row["floor_output_rounding"] = rel(ref_rounded.to(F8).float(), ref_rounded)
        if "bf16" in out:
            row["bf16_rel_err_vs_raw_inputs"] = rel(out["bf16"].transpose(1, 2).float(), ref_raw)
    # the backward: expected to be refused (torch's Flex backward takes no fp8); recorded either way
    q, k, v = (x.to(F8).transpose(1, 2).contiguous().requires_grad_(True) for x in raw)
    try:
        prepared = flex.prepare(
            mask,
            batch=1,
            heads_q=hq,
            heads_kv=hkv,
            head_dim=head_dim,
            dtype=F8,
            device=dev,
            form="blockmask",
            grad=True,
        )
        prepared.call(q, k, v).float().sum().backward()
        row["fp8_backward"] = "ran"
    except Exception as exc:  # noqa: BLE001
        row["fp8_backward"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--masks", nargs="+", default=["full", "causal", "causal_document"])
    p.add_argument("--seqlens", nargs="+", type=int, default=[4096, 16384])
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128, 256])
    p.add_argument("--heads", default="64:8")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--check-max", type=int, default=4096)
    p.add_argument("--device", default="cuda", help="cuda; cpu only exercises the script (CPU Flex takes no fp8)")
    args = p.parse_args()
    dev = torch.device(args.device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(json.dumps({"torch": torch.__version__, "gpu": gpu}), flush=True)
    for d in args.head_dims:
        for s in args.seqlens:
            for m in args.masks:
                try:
                    row = case(m, s, d, args, dev)
                except Exception:  # noqa: BLE001
                    row = {"mask": m, "seqlen": s, "head_dim": d, "error": traceback.format_exc()[-800:]}
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

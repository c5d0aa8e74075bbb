"""Linear attention (flash-linear-attention) against the best softmax kernel, tokens/s by length.

Standalone GPU benchmark for the crossover chart: for each head dim, length and pass it times
the four fla chunked kernels (longca's adapters, so the same code the pipeline runs) and causal
softmax attention through SDPA (cuDNN, else FlashAttention-2 inside torch), after checking every
kernel against its float64 reference (forward and gradients; a kernel that fails is `incorrect`
and is not timed). Writes OUT/linear_attention.json (settings, environment, rows, crossover
lengths) and OUT/linear_attention.csv (rows).

    python benchmarks/linear_attention.py OUT [--lengths 4096,...,524288] [--head-dims 64,128]
        [--heads 16 --heads-kv 16] [--passes fwd,fwd_bwd] [--budget-s 170]

Timing: CUDA events around each call, a 256 MiB L2 flush before each, one warm-up call (it also
compiles and autotunes, timed apart as compile_s), then up to --iters calls or --cap-s seconds per
measurement; median, p20, p80 and all samples are kept. Softmax cells whose time, predicted from
the previous length (x4 for causal attention), exceeds --softmax-cap-s are skipped with that
reason, as is everything left when the --budget-s deadline passes. FLOPs are each family's own
model (``flop_model``); tokens/s is the measure comparable across families.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from longca.kernels import registry  # noqa: E402
from longca.kernels.adapters.linear_fla import TOLERANCE  # noqa: E402
from longca.masks import regular  # noqa: E402
from longca.masks.mask import Mask  # noqa: E402
from longca.masks.registry import build_mask  # noqa: E402
from longca.measure.flops import attention_flops  # noqa: E402

LINEAR = ["fla_linear_attn", "fla_simple_gla", "fla_gla", "fla_gated_deltanet"]
SOFTMAX = "sdpa_softmax"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
CHECK_DOCS = (100, 700, 1, 1247)  # a causal_document mask for the varlen check (2048 tokens)


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double(), ref.detach().double()
    if not torch.isfinite(x).all():
        return math.inf
    return float((x - ref).norm() / ref.norm())


class Timer:
    """CUDA events with an L2 flush on the GPU; a monotonic clock on the CPU (smoke tests only)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.flush = torch.empty(256 * 2**20 if self.cuda else 1, dtype=torch.uint8, device=device)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _once(self, fn: Callable[[], Any]) -> float:
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def run(self, fn: Callable[[], Any], iters: int, cap_s: float, before: Callable[[], None] | None = None):
        """Warm-up call (returns its wall time as compile_s), then timed calls with an L2 flush."""
        t0 = time.perf_counter()
        if before:
            before()
        fn()
        self._sync()
        first_s = time.perf_counter() - t0
        samples: list[float] = []
        spent = 0.0
        while len(samples) < iters and (spent < cap_s or not samples):
            if before:
                before()
            self.flush.zero_()
            ms = self._once(fn)
            samples.append(ms)
            spent += ms / 1e3
        s = sorted(samples)
        q = lambda p: s[min(len(s) - 1, int(round(p * (len(s) - 1))))]  # noqa: E731
        return {
            "compile_s": first_s,
            "samples_ms": samples,
            "median_ms": q(0.5),
            "p20_ms": q(0.2),
            "p80_ms": q(0.8),
            "timed_iters": len(samples),
            "warmup_iters": 1,
            "l2_flush": self.cuda,
            "timer": "cuda_events" if self.cuda else "cpu_monotonic",
        }


def sdpa_call(backend_name: str, groups: int):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[
        backend_name
    ]

    def call(q, k, v):  # bshd in and out
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=groups > 1
            )
        return o.transpose(1, 2)

    return call


def inputs(batch, seqlen, hq, hkv, d, dtype, device, seed, grad):
    gen = torch.Generator(device=device).manual_seed(seed)
    mk = lambda h: torch.randn(batch, seqlen, h, d, generator=gen, device=device, dtype=torch.float32)  # noqa: E731
    q, k, v, do = mk(hq), mk(hkv), mk(hkv), mk(hq)
    out = [x.to(dtype) for x in (q, k, v, do)]
    for x in out[:3]:
        x.requires_grad_(grad)
    return out


def check(call, reference, batch, seqlen, hq, hkv, d, dtype, device) -> dict[str, Any]:
    """Forward and gradients of `call` against `reference` (float64) on the same rounded inputs."""
    q, k, v, do = inputs(batch, seqlen, hq, hkv, d, dtype, device, 7, True)
    rq, rk, rv = (x.detach().double().requires_grad_(True) for x in (q, k, v))
    out = call(q, k, v)
    out.backward(do)
    ref = reference(rq, rk, rv)
    ref.backward(do.double())
    return {
        "check_seqlen": seqlen,
        "rel_err_out": rel(out, ref),
        "rel_err_dq": rel(q.grad, rq.grad),
        "rel_err_dk": rel(k.grad, rk.grad),
        "rel_err_dv": rel(v.grad, rv.grad),
    }


def verdict(errs: dict[str, Any], tol: float) -> str | None:
    bad = [f"{k}={errs[k]:.3g}" for k in ("rel_err_out",) if not errs[k] <= tol]
    bad += [f"{k}={errs[k]:.3g}" for k in ("rel_err_dq", "rel_err_dk", "rel_err_dv") if not errs[k] <= 3 * tol]
    return f"above tolerance {tol:g} (grads {3 * tol:g}): " + ", ".join(bad) if bad else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--lengths", default=",".join(str(4096 * 2**i) for i in range(8)))  # 4K .. 512K
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--heads-kv", type=int, default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    ap.add_argument("--passes", default="fwd,fwd_bwd")
    ap.add_argument("--kernels", default=",".join(LINEAR))
    ap.add_argument("--no-softmax", action="store_true")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--cap-s", type=float, default=1.0, help="timed seconds per measurement (at least one call)")
    ap.add_argument("--softmax-cap-s", type=float, default=2.5, help="skip softmax cells predicted slower per call")
    ap.add_argument("--check-len", type=int, default=2048)
    ap.add_argument("--budget-s", type=float, default=170.0, help="stop measuring after this many seconds")
    ap.add_argument("--device", default="cuda", help="cpu only for smoke tests of this script (fla needs CUDA)")
    args = ap.parse_args()

    t_start = time.perf_counter()
    deadline = t_start + args.budget_s
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here (use --device cpu only to smoke-test this script)", file=sys.stderr)
        return 2
    cuda = device.type == "cuda"
    dtype = DTYPES[args.dtype]
    hq = args.heads
    hkv = args.heads_kv or hq
    lengths = [int(x) for x in args.lengths.split(",")]
    head_dims = [int(x) for x in args.head_dims.split(",")]
    passes = args.passes.split(",")
    kernels = [k for k in args.kernels.split(",") if k]
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        from importlib.metadata import version

        import fla  # noqa: F401

        fla_version = version("fla-core")
    except Exception as e:  # noqa: BLE001
        fla_version = None
        print(f"fla not importable: {e!r}", file=sys.stderr)

    rows: list[dict[str, Any]] = []
    base = {"batch": args.batch, "heads_q": hq, "heads_kv": hkv, "dtype": args.dtype, "mask": "causal"}
    timer = Timer(device)
    tol = TOLERANCE[args.dtype]

    # Softmax backend: the fastest that runs here (cuDNN on the H200, else FA2 inside torch).
    softmax_backend = None
    if not args.no_softmax:
        for name in ("cudnn", "flash") if cuda else ("math",):
            try:
                q, k, v, _ = inputs(1, 256, hq, hkv, 64, dtype, device, 0, True)
                sdpa_call(name, hq // hkv)(q, k, v).sum().backward()
                softmax_backend = name
                break
            except Exception as e:  # noqa: BLE001
                print(f"SDPA {name} unavailable: {e!r}", file=sys.stderr)

    def record(**kw):
        row = {**base, **kw}
        rows.append(row)
        short = {k: row.get(k) for k in ("kernel", "head_dim", "seqlen", "pass", "status", "median_ms", "tokens_per_s")}
        print(json.dumps(short), flush=True)

    for d in head_dims:
        # ---- correctness first (causal at check-len, and causal_document for the linear kernels)
        ok: dict[str, dict[str, Any] | None] = {}
        for name in kernels + ([SOFTMAX] if softmax_backend else []):
            if time.perf_counter() > deadline:
                ok[name] = None
                for s in lengths:
                    for p in passes:
                        record(
                            kernel=name,
                            head_dim=d,
                            seqlen=s,
                            **{"pass": p},
                            status="skipped",
                            reason=f"budget of {args.budget_s:g} s spent before the correctness check",
                        )
                continue
            if fla_version is None and name != SOFTMAX:
                ok[name] = None
                for s in lengths:
                    for p in passes:
                        record(
                            kernel=name,
                            head_dim=d,
                            seqlen=s,
                            **{"pass": p},
                            status="unsupported",
                            reason="fla not installed",
                        )
                continue
            try:
                if name == SOFTMAX:
                    groups = hq // hkv
                    errs = check(
                        sdpa_call(softmax_backend, groups),
                        lambda q, k, v: sdpa_call("math", groups)(q, k, v),
                        args.batch,
                        args.check_len,
                        hq,
                        hkv,
                        d,
                        dtype,
                        device,
                    )
                    reason = verdict(errs, tol)
                else:
                    kernel = registry.get(name)
                    reason = None
                    for mask in (
                        build_mask("causal", args.check_len),
                        Mask(
                            "causal_document",
                            sum(CHECK_DOCS),
                            sum(CHECK_DOCS),
                            regular.causal_document(CHECK_DOCS),
                            {},
                            CHECK_DOCS,
                        ),
                    ):
                        form = "causal" if mask.name == "causal" else "varlen"
                        prep = kernel.prepare(
                            mask,
                            batch=args.batch,
                            heads_q=hq,
                            heads_kv=hkv,
                            head_dim=d,
                            dtype=dtype,
                            device=device,
                            form=form,
                        )
                        e = check(
                            prep.call, prep.extra["reference"], args.batch, mask.seqlen_q, hq, hkv, d, dtype, device
                        )
                        if mask.name == "causal":
                            errs = e
                        else:
                            errs["varlen_rel_err_out"] = e["rel_err_out"]
                            errs["varlen_rel_err_dq"] = e["rel_err_dq"]
                        reason = reason or verdict(e, tol)
                        if reason:
                            reason = f"{mask.name}: {reason}"
                            break
                ok[name] = errs if reason is None else None
                if reason:
                    for s in lengths:
                        for p in passes:
                            record(
                                kernel=name,
                                head_dim=d,
                                seqlen=s,
                                **{"pass": p},
                                status="incorrect",
                                reason=reason,
                                **errs,
                            )
                else:
                    print(f"checked {name} D={d}: {json.dumps(errs)}", flush=True)
            except Exception as e:  # noqa: BLE001
                ok[name] = None
                msg = f"check failed: {e!r}"[:500]
                traceback.print_exc()
                for s in lengths:
                    for p in passes:
                        record(kernel=name, head_dim=d, seqlen=s, **{"pass": p}, status="error", reason=msg)

        # ---- timing, ascending length
        last_softmax_ms: dict[str, float] = {}  # per pass: the last measured softmax time and length
        last_length: dict[str, int] = {}
        for s in lengths:
            for name in [n for n in kernels + [SOFTMAX] if ok.get(n)]:
                for p in passes:
                    row = dict(kernel=name, head_dim=d, seqlen=s, **{"pass": p}, **ok[name])
                    if time.perf_counter() > deadline:
                        record(**row, status="skipped", reason=f"budget of {args.budget_s:g} s spent")
                        continue
                    if name == SOFTMAX and p in last_softmax_ms:
                        predicted = last_softmax_ms[p] * (s / last_length[p]) ** 2 / 1e3
                        if predicted > args.softmax_cap_s:
                            record(
                                **row,
                                status="skipped",
                                reason=f"predicted {predicted:.1f} s per call > --softmax-cap-s",
                            )
                            continue
                    try:
                        if name == SOFTMAX:
                            call = sdpa_call(softmax_backend, hq // hkv)
                            area = s * (s + 1) // 2 * args.batch
                            flops = attention_flops(area, hq, d, p)
                            flop_model, backend = "softmax_exact_area", f"sdpa {softmax_backend}"
                            family = "softmax"
                        else:
                            prep = registry.get(name).prepare(
                                build_mask("causal", s),
                                batch=args.batch,
                                heads_q=hq,
                                heads_kv=hkv,
                                head_dim=d,
                                dtype=dtype,
                                device=device,
                                form="causal",
                            )
                            call, flops = prep.call, prep.extra["flops"][p]
                            flop_model, backend, family = prep.extra["flop_model"], prep.info["backend"], "linear"
                        q, k, v, do = inputs(args.batch, s, hq, hkv, d, dtype, device, 1000 + s, p != "fwd")
                        if cuda:
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()

                        def clear():
                            for x in (q, k, v):
                                x.grad = None

                        if p == "fwd":

                            def fn():
                                with torch.no_grad():
                                    call(q, k, v)

                            t = timer.run(fn, args.iters, args.cap_s)
                        else:
                            t = timer.run(lambda: call(q, k, v).backward(do), args.iters, args.cap_s, before=clear)
                        med = t["median_ms"]
                        record(
                            **row,
                            **t,
                            status="ok",
                            reason=None,
                            kernel_family=family,
                            flops=flops,
                            flop_model=flop_model,
                            tflops=flops / (med * 1e-3) / 1e12,
                            tokens_per_s=args.batch * s / (med * 1e-3),
                            backend=backend,
                            peak_mem_bytes=int(torch.cuda.max_memory_allocated()) if cuda else None,
                        )
                        if name == SOFTMAX:
                            last_softmax_ms[p] = med
                            last_length[p] = s
                        q = k = v = do = None  # free the inputs before the next length
                    except torch.cuda.OutOfMemoryError as e:
                        record(**row, status="oom", reason=str(e).splitlines()[0][:300])
                    except Exception as e:  # noqa: BLE001
                        traceback.print_exc()
                        record(**row, status="error", reason=repr(e)[:500])
                    finally:
                        if cuda:
                            torch.cuda.empty_cache()

    # ---- crossover: the first measured length from which linear beats softmax in tokens/s
    crossover = []
    by = {(r["kernel"], r["head_dim"], r["pass"], r["seqlen"]): r for r in rows if r["status"] == "ok"}
    for d in head_dims:
        for p in passes:
            for name in kernels:
                faster = []
                for s in lengths:
                    lin, soft = by.get((name, d, p, s)), by.get((SOFTMAX, d, p, s))
                    if lin and soft:
                        faster.append((s, lin["tokens_per_s"] > soft["tokens_per_s"]))
                first = next((s for i, (s, f) in enumerate(faster) if all(g for _, g in faster[i:])), None)
                crossover.append(
                    {
                        "kernel": name,
                        "head_dim": d,
                        "pass": p,
                        "compared_lengths": [s for s, _ in faster],
                        "linear_faster_from": first,
                    }
                )

    env = {
        "device_name": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": _version("triton"),
        "fla_core": fla_version,
        "python": platform.python_version(),
        "softmax_backend": softmax_backend,
    }
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (args.out / "linear_attention.json").write_text(
        json.dumps(
            {
                "settings": settings,
                "environment": env,
                "wall_s": time.perf_counter() - t_start,
                "rows": rows,
                "crossover": crossover,
            },
            indent=1,
            default=str,
        )
    )
    cols = sorted({k for r in rows for k in r if k != "samples_ms"})
    with open(args.out / "linear_attention.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    print(json.dumps({"crossover": crossover, "wall_s": time.perf_counter() - t_start}, indent=1))
    return 0


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    sys.exit(main())

"""Check longca's CUDA timer against a bare `triton.testing.do_bench` loop on the same calls.

For the chosen kernels (default FA4 and cuDNN SDPA), full and causal, GQA 64:8 and MHA 32:32,
D=128, bf16, at the chosen lengths (default 32K) and passes (default forward; a backward is timed
on one forward's retained graph, gradients cleared before each call, as the sweeps time it):
longca's CudaTimer median vs do_bench's median, in one process. Writes a JSON list, or a Parquet
table when OUT ends in .parquet, and prints each case; the goal is agreement within 2%. With --rounds N
each case is measured N times, alternating the two timers, so the spread between rounds (how far
one run of either timer moves) is known beside their ratio; the row's ratio is the median of the
rounds' ratios.

do_bench's defaults (100 ms warm-up, 500 ms timed) keep the GPU busy about three times as long as
longca's 5 + 20 calls; a GPU that lowers its clock under sustained load then runs do_bench's calls
slower, which is not a timer difference. So each round also runs do_bench with warm-up and
repetition matched to longca's own duration (`matched_*`), and the SM clock is read after every
measurement (`*_clock_mhz`, NVML), to tell timer disagreement from clock drift.

--kernels picks the kernels (default both): a call cut short continues with the ones it missed.

With --spec and --sweep, longca's timer runs under that sweep's repeat protocol instead of the
fixed 5 + 20 calls: the figure a sweep publishes (for the dense sweep of specs/h200.yaml: warm-up cut
at 50 ms, then 10-1000 calls in 2 s), and the matched do_bench gets the warm-up and timed calls that
protocol actually made.

    python benchmarks/timer_fidelity.py OUT.json [--rounds 3] [--spec specs/h200.yaml --sweep dense]
    python benchmarks/timer_fidelity.py results/h200/fidelity/DATE-COMMIT-fidelity.parquet --rounds 3 \
        --spec specs/h200.yaml --sweep dense --kernels sdpa_cudnn,fa4,flex --seqlens 1K,4K,32K --passes fwd,bwd
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable

import torch
import triton.testing

from longca.kernels.base import choose_form, prepares_per_pass
from longca.kernels.registry import get
from longca.masks.forms import forms_of
from longca.masks.mask import Mask
from longca.masks.registry import build_mask
from longca.measure.env import gpu_clock_state
from longca.measure.flops import attention_flops
from longca.measure.timer import time_under, timer_for
from longca.spec.load import parse_seqlen

# the fixed protocol of the first published sets: 5 warm-up and exactly 20 timed calls
FIXED = {"warmup": 5, "iters": 20, "min_iters": 20, "budget_s": 60.0, "l2_flush": True}


def sweep_protocol(spec_path: str, sweep: str) -> dict:
    """The repeat settings every single-GPU cell of `sweep` shares (an error if they differ)."""
    from longca.spec.cells import expand, unknown_sweep
    from longca.spec.load import load_spec

    spec = load_spec(spec_path)
    if error := unknown_sweep(sweep, spec.name, (sw.name for sw in spec.sweeps)):
        raise SystemExit(error)
    repeats = {c.repeat for c in expand(spec) if c.sweep == sweep and c.world_size == 1}
    if not repeats:
        raise SystemExit(f"--sweep {sweep!r}: no single-GPU cells in {spec_path}, so no protocol for one GPU")
    if len(repeats) > 1:  # one sweep has one repeat today; refuse rather than pick one if that changes
        raise SystemExit(f"--sweep {sweep!r}: its single-GPU cells have {len(repeats)} repeat protocols, not one")
    return dict(next(iter(repeats)))


def fidelity_kernels(names: str) -> tuple[str, ...]:
    """The comma-separated kernels of --kernels, each a registered kernel (an error names the allowed ones)."""
    from longca.kernels.registry import load_all

    known = sorted(load_all())
    picked = tuple(n.strip() for n in names.split(",") if n.strip())
    unknown = [n for n in picked if n not in known]
    if unknown or not picked:
        raise SystemExit(
            f"--kernels {names!r}: unknown {', '.join(unknown) or '(none given)'}; allowed: {', '.join(known)}"
        )
    return picked


def make_call(
    kernel_name: str,
    mask: Mask,
    heads: tuple[int, int],
    pass_: str,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
) -> tuple[Callable[[], object], Callable[[], None] | None, list[torch.Tensor] | None]:
    """(fn, before, grads) of one case at head dim 128 and the mask's length: the forward call, or a
    backward on one forward's retained graph with `before` clearing the gradients `grads` (as the
    sweeps time it)."""
    kernel = get(kernel_name)
    hq, hkv = heads
    s = mask.seqlen_q
    grad = pass_ == "bwd"
    prep = kernel.prepare(
        mask, batch=1, heads_q=hq, heads_kv=hkv, head_dim=128, dtype=dtype, device=device,
        form=choose_form(kernel.caps, forms_of(mask.name)),
        **({"grad": grad} if prepares_per_pass(kernel) else {}),
    )  # fmt: skip
    shape = (1, s, hq, 128) if prep.layout == "bshd" else (1, hq, s, 128)
    shape_kv = (1, s, hkv, 128) if prep.layout == "bshd" else (1, hkv, s, 128)
    q = torch.randn(shape, device=device, dtype=dtype, requires_grad=grad)
    k = torch.randn(shape_kv, device=device, dtype=dtype, requires_grad=grad)
    v = torch.randn(shape_kv, device=device, dtype=dtype, requires_grad=grad)
    if not grad:
        return (lambda: prep.call(q, k, v)), None, None
    with torch.enable_grad():
        out = prep.call(q, k, v)
    do = torch.randn_like(out)

    def before():
        for x in (q, k, v):
            x.grad = None

    return (lambda: out.backward(do, retain_graph=True)), before, [q, k, v]


def measure_case(
    kernel_name: str,
    mask_name: str,
    heads: tuple[int, int],
    s: int,
    pass_: str,
    rep: dict,
    rounds: int,
    timer,
    bench,
    device: torch.device,
    dtype: torch.dtype = torch.bfloat16,
) -> dict:
    """One case: longca's timer under `rep` and `bench(fn, warmup_ms, rep_ms, grad_to_none)` (do_bench's
    median; its defaults when the two ms are None), alternating, `rounds` times."""
    hq, hkv = heads
    mask = build_mask(mask_name, s)
    grad = pass_ == "bwd"
    fn, before, grads = make_call(kernel_name, mask, heads, pass_, device, dtype)
    timings, theirs, matched = [], [], []
    clocks: dict[str, list] = {"longca": [], "do_bench": [], "matched": []}
    with torch.enable_grad() if grad else torch.no_grad():
        for _ in range(rounds):
            timings.append(time_under(timer, fn, rep, before))  # as a cell of the sweep is timed
            clocks["longca"].append(gpu_clock_state().get("clock_mhz"))
            theirs.append(bench(fn, None, None, grads))
            clocks["do_bench"].append(gpu_clock_state().get("clock_mhz"))
            # do_bench for as long as longca's own warm-up and timed calls took
            done = timings[-1]
            matched.append(bench(fn, done.warmup_iters * done.median_ms, done.timed_iters * done.median_ms, grads))
            clocks["matched"].append(gpu_clock_state().get("clock_mhz"))
    mine = [t.median_ms for t in timings]
    ratios = [a / b for a, b in zip(mine, theirs)]
    matched_ratios = [a / b for a, b in zip(mine, matched)]
    ours, bench_ms = statistics.median(mine), statistics.median(theirs)
    flops = attention_flops(mask.area, hq, 128, pass_)
    return {
        "kernel": kernel_name,
        "mask": mask_name,
        "heads": f"{hq}:{hkv}",
        "seqlen": s,
        "pass": pass_,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "longca_median_ms": ours,
        "do_bench_median_ms": bench_ms,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "longca_ms": mine,
        "do_bench_ms": theirs,
        "matched_ratio": statistics.median(matched_ratios),
        "matched_ratios": matched_ratios,
        "matched_do_bench_ms": matched,
        "longca_clock_mhz": clocks["longca"],
        "do_bench_clock_mhz": clocks["do_bench"],
        "matched_clock_mhz": clocks["matched"],
        "longca_tflops": flops / ours / 1e9,
        "do_bench_tflops": flops / bench_ms / 1e9,
        "timed_iters": [t.timed_iters for t in timings],
        "warmup_iters": [t.warmup_iters for t in timings],
        "protocol": rep,
    }


def do_bench(fn, warmup_ms: float | None, rep_ms: float | None, grad_to_none) -> float:
    """triton.testing.do_bench's median: its defaults (100 ms warm-up, 500 ms timed) or the given ms."""
    kw = {} if warmup_ms is None else {"warmup": warmup_ms, "rep": rep_ms}
    return triton.testing.do_bench(fn, grad_to_none=grad_to_none, return_mode="median", **kw)


def fidelity_passes(names: str) -> tuple[str, ...]:
    """The comma-separated passes of --passes (fwd, bwd; an error names the allowed ones)."""
    picked = tuple(n.strip() for n in names.split(",") if n.strip())
    if not picked or any(p not in ("fwd", "bwd") for p in picked):
        raise SystemExit(f"--passes {names!r}: allowed: fwd, bwd")
    return picked


def main(
    out: str,
    rounds: int = 1,
    protocol: dict | None = None,
    kernels: tuple[str, ...] = ("sdpa_cudnn", "fa4"),
    seqlens: tuple[int, ...] = (32768,),
    passes: tuple[str, ...] = ("fwd",),
    device: torch.device | None = None,
    bench=do_bench,
) -> list[dict]:
    rep = dict(FIXED if protocol is None else protocol)
    dev = device or torch.device("cuda")
    timer = timer_for(dev, l2_flush=bool(rep.get("l2_flush", True)))
    rows = []
    for kname in kernels:  # registered names (fidelity_kernels checks --kernels)
        for s in seqlens:
            for pass_ in passes:
                for mask_name in ("full", "causal"):
                    for heads in ((64, 8), (32, 32)):
                        try:
                            row = measure_case(kname, mask_name, heads, s, pass_, rep, rounds, timer, bench, dev)
                        except Exception as exc:  # noqa: BLE001 - a case that cannot run keeps its reason
                            row = {"kernel": kname, "mask": mask_name, "heads": f"{heads[0]}:{heads[1]}",
                                   "seqlen": s, "pass": pass_, "error": f"{type(exc).__name__}: {exc}"[:300]}  # fmt: skip
                        rows.append(row)
                        _save(rows, out)  # after every case: a call that runs out of time keeps the cases done
                        print(json.dumps(rows[-1]), flush=True)
    return rows


def _save(rows: list[dict], out: str) -> None:
    """All cases so far, replacing OUT atomically: JSON, or Parquet (zstd) for a .parquet name."""
    tmp = f"{out}.tmp"
    if out.endswith(".parquet"):
        import pyarrow as pa  # what the GPU host has (longca writes its cells with it); polars it lacks
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([{**r, "protocol": json.dumps(r.get("protocol"), sort_keys=True)} for r in rows])
        pq.write_table(table, tmp, compression="zstd")
    else:
        with open(tmp, "w") as fh:
            json.dump(rows, fh, indent=1)
    os.replace(tmp, out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--rounds", type=int, default=1, help="measurements per case, alternating the timers")
    ap.add_argument("--spec", help="time under a sweep's repeat protocol: the spec file (with --sweep)")
    ap.add_argument("--sweep", help="the sweep of --spec whose protocol longca's timer uses")
    ap.add_argument(
        "--kernels",
        default="sdpa_cudnn,fa4",
        help="comma-separated kernels to check (a call cut short continues with the rest)",
    )
    ap.add_argument("--seqlens", default="32K", help="comma-separated lengths, e.g. 1K,4K,32K")
    ap.add_argument("--passes", default="fwd", help="comma-separated passes: fwd, bwd")
    args = ap.parse_args()
    if (args.spec is None) != (args.sweep is None):
        ap.error("--spec and --sweep go together")
    main(
        args.out,
        args.rounds,
        sweep_protocol(args.spec, args.sweep) if args.spec else None,
        fidelity_kernels(args.kernels),
        tuple(parse_seqlen(x.strip(), "--seqlens") for x in args.seqlens.split(",")),
        fidelity_passes(args.passes),
    )

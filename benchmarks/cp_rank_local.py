"""One rank's context-parallel forward on one device: its local work, timed, against one device's kernel.

Ring P2P (or Ring all-gather) at world W is played rank by rank in one process
(`longca.cp.comm.LocalComm`: every participant's K/V in memory, nothing sent). What is timed is
exactly the rank's own attention calls and the combination of their results: the part of the CP
gap to the single-device kernel that communication cannot explain (the CP cells measure the
exposed communication apart). Per rank: its exact attended area's TFLOP/s. Per configuration:
the CP convention, global FLOPs / (max-rank time x W), over the single-device kernel's TFLOP/s on
one rank's tokens with the same mask (`--single`, default SDPA cuDNN). Before timing, every
rank's output is checked against the float32 reference at `--check-seqlen` total tokens.

    python benchmarks/cp_rank_local.py OUT.json [--masks causal full] [--tokens-per-gpu 32768]
        [--world 2] [--heads 64:8 64:64] [--kernel sdpa_cudnn] [--mechanism ring_p2p] [--pass fwd]

`--pass bwd` times a rank's local backward instead: every ring step's `kernel.bwd` on the combined
(out, LSE) of the rank's forward, and the float32 accumulation of its gradients (what `ring_bwd`
computes between transfers); the check then compares every rank's dq and the summed dk, dv with the
reference gradients. With `--kernel flex`, `--also-autograd` times the same steps through
`bwd_by_autograd` (the step's forward run again under autograd: the CP Flex backward before
longca.kernels.flex_backward) beside it.
The single-device baseline is then the kernel's backward alone (a fresh untimed forward before each
timed backward, as the sweeps' default protocol).

Writes one JSON object per configuration (a list) and prints a line each. CUDA only for numbers
that mean anything; on the CPU (`--device cpu --kernel naive`, small sizes) it runs end to end.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

import torch

from longca.cp.comm import LocalComm
from longca.cp.mechanisms import build_plan, cp_attention
from longca.cp.reference import reference_attention
from longca.cp.sharding import make_sharding
from longca.cp.topology import Topology
from longca.kernels.base import choose_form
from longca.kernels.registry import get, rank_kernel
from longca.masks.forms import forms_of
from longca.masks.registry import build_mask
from longca.measure.flops import attention_flops
from longca.measure.reference import relative_error
from longca.measure.timer import timer_for

# As the CP sweeps of specs/h200-cp.yaml balance these masks; others zigzag.
BALANCE = {
    "causal": "zigzag",
    "full": "contiguous",
    "causal_document": "document",
    "full_document": "document",
    "share_question": "document",
}


def _plans(mask_name, mask, world, hq, hk, kernel, device, mechanism, q, k, v):
    """Per rank: (plan, local q, its (k, v), its global positions) over the same global inputs."""
    sharding = make_sharding(BALANCE.get(mask_name, "zigzag"), q.shape[2], world, mask.slices)
    pos = [torch.from_numpy(sharding.positions(r)).to(q.device) for r in range(world)]
    kv_of = [(k[:, :, p].contiguous(), v[:, :, p].contiguous()) for p in pos]
    out = []
    for r in range(world):
        plan = build_plan(
            mechanism,
            None,
            mask.slices,
            sharding,
            r,
            hq,
            hk,
            kernel,
            device,
            LocalComm(kv_of, r),
            topo=Topology(world, r, 1, world),
        )
        out.append((plan, q[:, :, pos[r]].contiguous(), kv_of[r], pos[r]))
    return out


def _inputs(s, hq, hk, d, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    return [torch.randn(1, h, s, d, generator=g, device=device, dtype=dtype) for h in (hq, hk, hk)]


def check(mask_name, world, hq, hk, d, dtype, kernel, device, mechanism, s) -> float:
    """Largest relative error of a rank's output against the float32 reference rows."""
    mask = build_mask(mask_name, s)
    q, k, v = _inputs(s, hq, hk, d, dtype, device, 1)
    ref = reference_attention(q, k, v, mask.slices, None, torch.float32, kv_heads_per_chunk=1)[0]
    errs = []
    with torch.no_grad():
        for plan, ql, (kl, vl), pos in _plans(mask_name, mask, world, hq, hk, kernel, device, mechanism, q, k, v):
            errs.append(relative_error(cp_attention(ql, kl, vl, plan), ref[:, :, pos]))
    return max(errs)


def check_bwd(mask_name, world, hq, hk, d, dtype, kernel, device, mechanism, s) -> dict:
    """Largest relative errors of the ranks' local backward (out, dq, dk, dv) against the reference."""
    mask = build_mask(mask_name, s)
    q, k, v = _inputs(s, hq, hk, d, dtype, device, 1)
    do = _inputs(s, hq, hk, d, dtype, device, 4)[0]
    ref = reference_attention(q, k, v, mask.slices, do, torch.float32, kv_heads_per_chunk=1)
    dk, dv = torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)
    err = {"out": 0.0, "dq": 0.0}
    with torch.no_grad():
        plans = _plans(mask_name, mask, world, hq, hk, kernel, device, mechanism, q, k, v)
        pos_of = [p for *_, p in plans]
        for plan, ql, (kl, vl), pos in plans:
            out, lse = plan.attend_fwd(ql, kl, vl)
            err["out"] = max(err["out"], relative_error(out, ref[0][:, :, pos]))
            dq, grads = _local_bwd(plan, do[:, :, pos], ql, out.to(dtype), lse, kernel.bwd)
            err["dq"] = max(err["dq"], relative_error(dq, ref[1][:, :, pos]))
            for j, (gk, gv) in grads.items():
                dk[:, :, pos_of[j]] += gk
                dv[:, :, pos_of[j]] += gv
    err["dk"], err["dv"] = relative_error(dk, ref[2]), relative_error(dv, ref[3])
    return err


def _local_bwd(plan, dout, q, out, lse, bwd):
    """One rank's backward work: every non-empty step's bwd against participant j's K/V and the
    float32 accumulation; returns dq and {j: (dk_j, dv_j)}, this rank's contributions."""
    a = torch.float64 if q.dtype == torch.float64 else torch.float32
    dq = torch.zeros(q.shape, device=q.device, dtype=a)
    grads = {}
    for j, sub in enumerate(plan.subs):
        if sub.empty:
            continue
        kj, vj = plan.comm.kv_of[j]
        g = bwd(dout, q, kj, vj, out, lse, sub)
        dq += g[0]
        grads[j] = (g[1], g[2])
    return dq, grads


def single_device(mask_name, s, hq, hk, d, dtype, device, kernel_name, timer, rep, pass_="fwd") -> dict:
    """The single-device kernel on one rank's token count: the CP goal's baseline."""
    kernel = get(kernel_name)
    mask = build_mask(mask_name, s)
    form = choose_form(kernel.caps, forms_of(mask_name))
    prepared = kernel.prepare(mask, batch=1, heads_q=hq, heads_kv=hk, head_dim=d, dtype=dtype, device=device, form=form)
    q, k, v = _inputs(s, hq, hk, d, dtype, device, 2)
    if pass_ == "fwd":
        with torch.no_grad():
            t = timer.time(lambda: prepared.call(q, k, v), **rep)
    else:
        q, k, v = (x.requires_grad_(True) for x in (q, k, v))
        do = torch.randn_like(q)
        saved = {}

        def fresh_forward():
            for x in (q, k, v):
                x.grad = None
            saved["out"] = prepared.call(q, k, v)

        t = timer.time(lambda: saved["out"].backward(do), before=fresh_forward, **rep)
    flops = attention_flops(mask.area, hq, d, pass_)
    return {
        "single_kernel": kernel_name,
        "single_form": form,
        "single_ms": t.median_ms,
        "single_tflops": flops / (t.median_ms * 1e-3) / 1e12,
    }


def measure(mask_name, world, per_gpu, hq, hk, d, dtype, kernel, device, mechanism, timer, rep) -> dict:
    s = world * per_gpu
    mask = build_mask(mask_name, s)
    q, k, v = _inputs(s, hq, hk, d, dtype, device, 3)
    ranks = []
    with torch.no_grad():
        for plan, ql, (kl, vl), _ in _plans(mask_name, mask, world, hq, hk, kernel, device, mechanism, q, k, v):
            t = timer.time(lambda: cp_attention(ql, kl, vl, plan), **rep)
            area = plan.rank_area(1)[plan.topo.rank]
            ranks.append(
                {
                    "ms": t.median_ms,
                    "area": area,
                    "timed_iters": t.timed_iters,
                    "tflops": attention_flops(area, hq, d, "fwd") / (t.median_ms * 1e-3) / 1e12,
                }
            )
    slowest = max(r["ms"] for r in ranks)
    per_gpu_tflops = attention_flops(mask.area, hq, d, "fwd") / (slowest * 1e-3 * world) / 1e12
    # whether the local kernel passed GQA K/V unrepeated (sdpa decides once per device, dtype, head dim)
    native = kernel.native_gqa(q) if hq != hk else None
    return {
        "mask": mask_name,
        "world": world,
        "tokens_per_gpu": per_gpu,
        "seqlen": s,
        "heads": f"{hq}:{hk}",
        "head_dim": d,
        "mechanism": mechanism,
        "balance": BALANCE.get(mask_name, "zigzag"),
        "kernel": kernel.name,
        "native_gqa": native,
        "ranks": ranks,
        "cp_per_gpu_tflops": per_gpu_tflops,
    }


def measure_bwd(
    mask_name, world, per_gpu, hq, hk, d, dtype, kernel, device, mechanism, timer, rep, also_autograd: bool
) -> dict:
    """Per rank: its local backward (steps' bwd on the combined out/LSE, accumulation) timed."""
    from longca.kernels.rank import bwd_by_autograd

    s = world * per_gpu
    mask = build_mask(mask_name, s)
    q, k, v = _inputs(s, hq, hk, d, dtype, device, 3)
    do = _inputs(s, hq, hk, d, dtype, device, 5)[0]
    ways = {"direct": kernel.bwd}
    if also_autograd:
        ways["autograd"] = lambda dout, q_, k_, v_, o, lse, sub: bwd_by_autograd(
            lambda a, b, c: kernel._call(a, b, c, sub), dout, q_, k_, v_, o, lse
        )
    ranks = []
    with torch.no_grad():
        for plan, ql, (kl, vl), pos in _plans(mask_name, mask, world, hq, hk, kernel, device, mechanism, q, k, v):
            out, lse = plan.attend_fwd(ql, kl, vl)
            out, dl = out.to(dtype), do[:, :, pos].contiguous()
            area = plan.rank_area(1)[plan.topo.rank]
            rank = {"area": area}
            for name, bwd in ways.items():
                t = timer.time(lambda: _local_bwd(plan, dl, ql, out, lse, bwd), **rep)
                rank[f"{name}_ms"] = t.median_ms
                rank[f"{name}_iters"] = t.timed_iters
                rank[f"{name}_tflops"] = attention_flops(area, hq, d, "bwd") / (t.median_ms * 1e-3) / 1e12
            ranks.append(rank)
    row = {
        "mask": mask_name,
        "world": world,
        "tokens_per_gpu": per_gpu,
        "seqlen": s,
        "heads": f"{hq}:{hk}",
        "head_dim": d,
        "mechanism": mechanism,
        "balance": BALANCE.get(mask_name, "zigzag"),
        "pass": "bwd",
        "kernel": kernel.name,
        "ranks": ranks,
    }
    for name in ways:
        slowest = max(r[f"{name}_ms"] for r in ranks)
        row[f"cp_per_gpu_tflops_{name}"] = attention_flops(mask.area, hq, d, "bwd") / (slowest * 1e-3 * world) / 1e12
    row["cp_per_gpu_tflops"] = row["cp_per_gpu_tflops_direct"]
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--masks", nargs="+", default=["causal", "full"])
    ap.add_argument("--tokens-per-gpu", type=int, nargs="+", default=[32768])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--heads", nargs="+", default=["64:8", "64:64"])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kernel", default="sdpa_cudnn", help="the per-rank local kernel (longca.kernels.rank)")
    ap.add_argument(
        "--single",
        default="sdpa_cudnn",
        help="the single-device kernel (longca.kernels); 'none' skips it (compare with sweep rows)",
    )
    ap.add_argument("--mechanism", default="ring_p2p", choices=["ring_p2p", "ring_allgather"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--check-seqlen", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--pass", dest="pass_", default="fwd", choices=["fwd", "bwd"])
    ap.add_argument(
        "--also-autograd",
        action="store_true",
        help="with --pass bwd: also time the steps through bwd_by_autograd (forward run again)",
    )
    args = ap.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    kernel = rank_kernel(args.kernel)
    if args.also_autograd and (args.pass_ != "bwd" or args.kernel != "flex"):
        # only Flex keeps a differentiable step forward (`Flex._call`) beside its backward kernel
        ap.error(f"--also-autograd needs --pass bwd and --kernel flex, not --pass {args.pass_} --kernel {args.kernel}")
    timer = timer_for(device, l2_flush=device.type == "cuda")
    rep = {"warmup": 3, "iters": args.iters, "min_iters": 5, "budget_s": 3.0}
    rows = []
    for heads in args.heads:
        hq, hk = (int(x) for x in heads.split(":"))
        for mask_name in args.masks:
            try:
                checked = (mask_name, args.world, hq, hk, args.head_dim, dtype, kernel, device)
                checked += (args.mechanism, args.check_seqlen)
                errs = {"out": check(*checked)} if args.pass_ == "fwd" else check_bwd(*checked)
            except Exception:  # noqa: BLE001 - recorded; the next configuration still runs
                errs = {"failure": traceback.format_exc()}
            for per_gpu in args.tokens_per_gpu:
                row = {
                    "mask": mask_name,
                    "heads": heads,
                    "tokens_per_gpu": per_gpu,
                    "check_seqlen": args.check_seqlen,
                    **{f"rel_err_{k}": e for k, e in errs.items()},
                }
                if "failure" in errs:
                    row["status"] = "error"
                elif max(errs.values()) > 2e-2:  # a wrong result is never timed
                    row["status"] = "incorrect"
                else:
                    try:
                        shape = (mask_name, args.world, per_gpu, hq, hk, args.head_dim, dtype, kernel, device)
                        timing = (args.mechanism, timer, rep)
                        if args.pass_ == "fwd":
                            row.update(measure(*shape, *timing))
                        else:
                            row.update(measure_bwd(*shape, *timing, args.also_autograd))
                        if args.single != "none":
                            row.update(
                                single_device(
                                    mask_name,
                                    per_gpu,
                                    hq,
                                    hk,
                                    args.head_dim,
                                    dtype,
                                    device,
                                    args.single,
                                    timer,
                                    rep,
                                    args.pass_,
                                )
                            )
                            row["ratio"] = row["cp_per_gpu_tflops"] / row["single_tflops"]
                        row["status"] = "ok"
                    except Exception:  # noqa: BLE001
                        row.update(status="error", failure=traceback.format_exc())
                rows.append(row)
                print(
                    json.dumps(
                        {
                            k: row.get(k)
                            for k in (
                                "mask",
                                "heads",
                                "tokens_per_gpu",
                                "status",
                                "rel_err_out",
                                "rel_err_dq",
                                "rel_err_dk",
                                "rel_err_dv",
                                "cp_per_gpu_tflops",
                                "cp_per_gpu_tflops_autograd",
                                "single_tflops",
                                "ratio",
                            )
                        }
                    ),
                    flush=True,
                )
                if "failure" in row or "failure" in errs:
                    print(row.get("failure") or errs["failure"], file=sys.stderr, flush=True)
                with open(args.out, "w") as f:  # after every row: a call cut short keeps what ran
                    json.dump(rows, f, indent=1)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

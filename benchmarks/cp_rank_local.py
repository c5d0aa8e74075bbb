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
        [--world 2] [--heads 64:8 64:64] [--kernel sdpa_cudnn] [--mechanism ring_p2p]

Writes one JSON object per configuration (a list) and prints a line each. CUDA only for numbers
that mean anything; on the CPU (`--device cpu --kernel naive`, small sizes) it runs end to end.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from longca.cp.comm import LocalComm
from longca.cp.local import get_local
from longca.cp.mechanisms import build_plan, cp_attention
from longca.cp.reference import reference_attention, rel_err
from longca.cp.sharding import make_sharding
from longca.cp.topology import Topology
from longca.kernels.base import choose_form
from longca.kernels.registry import get
from longca.masks.forms import forms_of
from longca.masks.registry import build_mask
from longca.measure.flops import attention_flops
from longca.measure.timer import timer_for

BALANCE = {"causal": "zigzag", "full": "contiguous", "causal_document": "document", "full_document": "document"}


def _plans(mask_name, mask, world, hq, hk, kernel, device, mechanism, q, k, v):
    """Per rank: (plan, local q, its (k, v), its global positions) over the same global inputs."""
    sharding = make_sharding(BALANCE.get(mask_name, "zigzag"), q.shape[2], world, mask.slices)
    pos = [torch.from_numpy(sharding.positions(r)).to(q.device) for r in range(world)]
    kv_of = [(k[:, :, p].contiguous(), v[:, :, p].contiguous()) for p in pos]
    out = []
    for r in range(world):
        plan = build_plan(mechanism, None, mask.slices, sharding, r, hq, hk, kernel, device,
                          LocalComm(kv_of, r), topo=Topology(world, r, 1, world))
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
            errs.append(rel_err(cp_attention(ql, kl, vl, plan), ref[:, :, pos]))
    return max(errs)


def single_device(mask_name, s, hq, hk, d, dtype, device, kernel_name, timer, rep) -> dict:
    """The single-device kernel on one rank's token count: the CP goal's baseline."""
    kernel = get(kernel_name)
    mask = build_mask(mask_name, s)
    form = choose_form(kernel.caps, forms_of(mask_name))
    prepared = kernel.prepare(mask, batch=1, heads_q=hq, heads_kv=hk, head_dim=d, dtype=dtype, device=device,
                              form=form)
    q, k, v = _inputs(s, hq, hk, d, dtype, device, 2)
    with torch.no_grad():
        t = timer.time(lambda: prepared.call(q, k, v), **rep)
    flops = attention_flops(mask.area, hq, d, "fwd")
    return {"single_kernel": kernel_name, "single_form": form, "single_ms": t.median_ms,
            "single_tflops": flops / (t.median_ms * 1e-3) / 1e12}


def measure(mask_name, world, per_gpu, hq, hk, d, dtype, kernel, device, mechanism, timer, rep) -> dict:
    s = world * per_gpu
    mask = build_mask(mask_name, s)
    q, k, v = _inputs(s, hq, hk, d, dtype, device, 3)
    ranks = []
    with torch.no_grad():
        for plan, ql, (kl, vl), _ in _plans(mask_name, mask, world, hq, hk, kernel, device, mechanism, q, k, v):
            t = timer.time(lambda: cp_attention(ql, kl, vl, plan), **rep)
            area = plan.rank_area(1)[plan.topo.rank]
            ranks.append({"ms": t.median_ms, "area": area, "timed_iters": t.timed_iters,
                          "tflops": attention_flops(area, hq, d, "fwd") / (t.median_ms * 1e-3) / 1e12})
    slowest = max(r["ms"] for r in ranks)
    per_gpu_tflops = attention_flops(mask.area, hq, d, "fwd") / (slowest * 1e-3 * world) / 1e12
    # whether the local kernel passed GQA K/V unrepeated (sdpa decides once per device, dtype, head dim)
    native = kernel.native_gqa(q) if hq != hk and hasattr(kernel, "native_gqa") else None
    return {"mask": mask_name, "world": world, "tokens_per_gpu": per_gpu, "seqlen": s, "heads": f"{hq}:{hk}",
            "head_dim": d, "mechanism": mechanism, "balance": BALANCE.get(mask_name, "zigzag"),
            "kernel": kernel.name, "native_gqa": native, "ranks": ranks, "cp_per_gpu_tflops": per_gpu_tflops}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--masks", nargs="+", default=["causal", "full"])
    ap.add_argument("--tokens-per-gpu", type=int, nargs="+", default=[32768])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--heads", nargs="+", default=["64:8", "64:64"])
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--kernel", default="sdpa_cudnn", help="the per-rank local kernel (longca.cp.local)")
    ap.add_argument("--single", default="sdpa_cudnn", help="the single-device kernel (longca.kernels)")
    ap.add_argument("--mechanism", default="ring_p2p", choices=["ring_p2p", "ring_allgather"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--check-seqlen", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    kernel = get_local(args.kernel)
    timer = timer_for(device, l2_flush=device.type == "cuda")
    rep = {"warmup": 3, "iters": args.iters, "min_iters": 5, "budget_s": 3.0}
    rows = []
    for heads in args.heads:
        hq, hk = (int(x) for x in heads.split(":"))
        for mask_name in args.masks:
            err = check(mask_name, args.world, hq, hk, args.head_dim, dtype, kernel, device, args.mechanism,
                        args.check_seqlen)
            for per_gpu in args.tokens_per_gpu:
                row = {"rel_err_out": err, "check_seqlen": args.check_seqlen}
                if err > 2e-2:  # a wrong result is never timed
                    row.update(mask=mask_name, heads=heads, tokens_per_gpu=per_gpu, status="incorrect")
                else:
                    row.update(measure(mask_name, args.world, per_gpu, hq, hk, args.head_dim, dtype, kernel,
                                       device, args.mechanism, timer, rep))
                    row.update(single_device(mask_name, per_gpu, hq, hk, args.head_dim, dtype, device,
                                             args.single, timer, rep))
                    row["ratio"] = row["cp_per_gpu_tflops"] / row["single_tflops"]
                    row["status"] = "ok"
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("mask", "heads", "tokens_per_gpu", "status", "rel_err_out",
                                                           "cp_per_gpu_tflops", "single_tflops", "ratio")}), flush=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

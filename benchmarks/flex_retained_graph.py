"""Does compiled FlexAttention run several backwards on one forward's retained graph, correctly?

`repeat.backward: retained_graph` times every backward of a cell on one forward's graph; kernels
declare whether that works (`Capabilities.retained_backward`). Flex declared False after the first
H200 session, where its backward rows errored on one retained graph (cause not kept), until this
check passed on the H200 (torch 2.11, gradients bitwise equal). Run it again on a new stack; it goes
through longca's own Flex adapter (compiled flex_attention, donated buffers off, BlockMask from
the mask slices): for each mask, one forward, then `--repeats` backwards with `retain_graph=True`
(gradients cleared before each, as the runner does), each compared with the gradients of a fresh
forward + backward on the same inputs. Prints one JSON line per mask and a summary; exit code 0
only if every mask ran every backward and matched.

    python benchmarks/flex_retained_graph.py --device cuda [--seqlen 4096] [--masks causal full_document]
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

import torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(
        torch.linalg.vector_norm(a.double() - b.double()) / torch.linalg.vector_norm(b.double()).clamp_min(1e-30)
    )


def check_mask(name: str, args: argparse.Namespace, dev: torch.device) -> dict:
    from longca.kernels.registry import get
    from longca.masks.registry import build_mask

    hq, hkv = (int(x) for x in args.heads.split(":"))
    dtype = getattr(torch, args.dtype)
    kernel = get("flex")
    mask = build_mask(name, args.seqlen, seed=0)
    prepared = kernel.prepare(
        mask,
        batch=1,
        heads_q=hq,
        heads_kv=hkv,
        head_dim=args.head_dim,
        dtype=dtype,
        device=dev,
        form="blockmask",
        grad=True,
    )
    g = torch.Generator(device=dev).manual_seed(0)
    shape = {"q": hq, "k": hkv, "v": hkv, "do": hq}
    t = {
        n: torch.randn(1, h, args.seqlen, args.head_dim, generator=g, device=dev, dtype=dtype) for n, h in shape.items()
    }
    q, k, v = (t[n].requires_grad_(True) for n in "qkv")

    def grads():
        out = [x.grad.detach().clone() for x in (q, k, v)]
        for x in (q, k, v):
            x.grad = None
        return out

    prepared.call(q, k, v).backward(t["do"])  # fresh forward + backward: the expected gradients
    expected = grads()
    out = prepared.call(q, k, v)
    errs = []
    for _ in range(args.repeats):
        out.backward(t["do"], retain_graph=True)
        errs.append(max(rel(a, b) for a, b in zip(grads(), expected)))
    return {"mask": name, "backwards": len(errs), "max_rel_diff": max(errs), "ok": max(errs) <= args.tol}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--heads", default="16:2", help="query:kv heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-2, help="largest relative gradient difference accepted")
    ap.add_argument("--masks", nargs="*", default=["full", "causal", "causal_document", "sliding_window"])
    args = ap.parse_args()
    dev = torch.device(args.device)
    results = []
    for name in args.masks:
        try:
            r = check_mask(name, args, dev)
        except Exception as exc:  # noqa: BLE001 - the refusal is the finding: record it, go on
            r = {
                "mask": name,
                "ok": False,
                "error": f"{type(exc).__name__}: {str(exc)[:500]}",
                "where": traceback.format_exc(limit=3)[-800:],
            }
        results.append(r)
        print(json.dumps(r), flush=True)
    summary = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "seqlen": args.seqlen,
        "heads": args.heads,
        "all_ok": all(r["ok"] for r in results),
    }
    print(json.dumps(summary))
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Run each FlashAttention-4 form once at a small size and print OK / error per form.

For a first GPU call: unpack the FA4 bundle made by the project's pack script (see
docs/kernels.md), put it on PYTHONPATH, then

    PYTHONPATH=$FA4:$FA4/nvidia_cutlass_dsl/dsl_packages:. python tools/fa4_smoke.py

Every case goes through the "fa4" adapter's own prepare() and is checked against the float64
dense-mask reference, forward and gradients (bf16 tolerance). Exit status 1 if any case failed.
"""

from __future__ import annotations

import sys
import time
import traceback

import torch

from longca.kernels import registry
from longca.kernels.base import Unsupported
from longca.masks.registry import build_mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error

TOL_OUT, TOL_GRAD = 2e-2, 5e-2

# (label, mask name, mask params, form, head_dim, heads_q, heads_kv, batch, block sparsity)
CASES = [
    ("full", "full", {}, "full", 128, 4, 2, 2, True),
    ("causal", "causal", {}, "causal", 128, 4, 2, 2, True),
    ("window", "sliding_window", {"window": 100}, "window", 128, 4, 2, 2, True),
    ("causal_window", "causal_sliding_window", {"window": 100}, "window", 128, 4, 2, 2, True),
    ("varlen_full", "full_document", {}, "varlen", 128, 4, 2, 2, True),
    ("varlen_causal", "causal_document", {}, "varlen", 128, 4, 2, 2, True),
    ("mask_mod+blocks", "prefix_lm_causal", {"prefix": 300}, "slices", 128, 4, 2, 2, True),
    ("mask_mod", "prefix_lm_causal", {"prefix": 300}, "slices", 128, 4, 2, 2, False),
    ("mask_mod+blocks/2layers", "share_question", {}, "slices", 128, 4, 2, 1, True),
    (
        "mask_mod+blocks/global_sw",
        "global_sliding_window",
        {"global_tokens": 40, "window": 90},
        "slices",
        128,
        4,
        4,
        1,
        True,
    ),
    ("mask_mod+blocks/d64", "block_causal_document", {"block": 64}, "slices", 64, 4, 2, 1, True),
    ("mask_mod/d256", "causal_blockwise", {}, "slices", 256, 4, 2, 1, False),
    ("causal/d256", "causal", {}, "causal", 256, 4, 2, 1, True),
    ("causal/d64", "causal", {}, "causal", 64, 8, 1, 1, True),
]


def run_case(kernel, label, name, params, form, head_dim, hq, hkv, batch, blocks, seqlen=1024):
    kernel.use_block_sparsity = blocks
    mask = build_mask(name, seqlen, params, seed=1)
    dev = torch.device("cuda")
    t0 = time.perf_counter()
    prepared = kernel.prepare(
        mask, batch=batch, heads_q=hq, heads_kv=hkv, head_dim=head_dim, dtype=torch.bfloat16, device=dev, form=form
    )
    prep_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(batch, seqlen, h, head_dim, generator=gen, dtype=torch.float64, requires_grad=True)
        for h in (hq, hkv, hkv)
    )
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cpu")))
    dout = torch.randn_like(ref)
    ref.backward(dout)
    ins = [t.detach().to(dev, torch.bfloat16) for t in (q, k, v)]
    if prepared.layout == "thd":
        ins = [t.reshape(batch * seqlen, *t.shape[2:]) for t in ins]
    ins = [t.requires_grad_() for t in ins]
    t1 = time.perf_counter()
    out = prepared.call(*ins)  # the first call compiles (prepare calls nothing)
    out.backward(dout.to(dev, torch.bfloat16).reshape(out.shape))
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t1
    errs = {"out": relative_error(out.float().cpu().reshape(ref.shape), ref)}
    for g, t, n in zip(ins, (q, k, v), ("dq", "dk", "dv")):
        errs[n] = relative_error(g.grad.float().cpu().reshape(t.shape), t.grad)
    ok = errs["out"] < TOL_OUT and all(errs[n] < TOL_GRAD for n in ("dq", "dk", "dv"))
    detail = " ".join(f"{n}={e:.1e}" for n, e in errs.items())
    extra = {k: prepared.info[k] for k in ("block_sparse", "mask_mod_layers", "num_segments") if k in prepared.info}
    return ok, f"{detail} prepare={prep_s:.2f}s first call (compiles)={first_s:.2f}s layout={prepared.layout} {extra}"


def main() -> int:
    print(f"torch {torch.__version__}, device {torch.cuda.get_device_name()}, cc {torch.cuda.get_device_capability()}")
    try:
        import flash_attn.cute as fa

        print(f"flash_attn.cute {getattr(fa, '__version__', '?')} from {fa.__file__}")
    except Exception as exc:  # noqa: BLE001 - report and stop
        print(f"flash_attn.cute import failed: {exc!r}")
        return 1
    kernel = registry.get("fa4")
    failed = 0
    for case in CASES:
        label = case[0]
        try:
            ok, detail = run_case(kernel, *case)
            print(f"{'OK   ' if ok else 'WRONG'} {label:28s} {detail}", flush=True)
            failed += not ok
        except Unsupported as exc:
            print(f"UNSUP {label:28s} {exc}", flush=True)
        except Exception as exc:  # noqa: BLE001 - one line per failure, then the tail of the trace
            failed += 1
            print(f"ERROR {label:28s} {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            print("      " + "      ".join(traceback.format_exc().splitlines(keepends=True)[-6:]), flush=True)
        finally:
            torch.cuda.synchronize()
    print(f"{len(CASES) - failed}/{len(CASES)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Named lists of CP cells for `python -m longca.cp.bench --preset NAME` (until the spec layer
generates CP cells itself). Each preset is a function of nothing returning cell dicts."""

from __future__ import annotations

import itertools
from typing import Callable

K = 1024


def _cell(mechanism: str, mask: str, seqlen: int, hq: int, hk: int, pass_: str, world: int, balance: str,
          kernel: str, device: str = "cuda", dtype: str = "bfloat16", warmup: int = 3, iters: int = 10,
          budget_s: float = 60.0, degrees: dict | None = None) -> dict:
    cid = f"{mechanism}-{mask}-S{seqlen}-h{hq}x{hk}-{pass_}-w{world}-{balance}-{kernel}-{dtype}"
    return {"cell_id": cid, "mechanism": mechanism, "mask": mask, "mask_params": {}, "seqlen": seqlen, "batch": 1,
            "heads_q": hq, "heads_kv": hk, "head_dim": 128, "dtype": dtype, "pass": pass_, "world_size": world,
            "degrees": degrees or {}, "balance": balance, "local_kernel": kernel, "seed": 0, "warmup": warmup,
            "iters": iters, "budget_s": budget_s, "device": device,
            "backend": "nccl" if device == "cuda" else "gloo"}


def h200_goal(kernel: str = "sdpa_cudnn") -> list[dict]:
    """Issue goal on 2 GPUs: full and causal at 32K and 64K tokens per GPU, GQA 64:8 and MHA,
    fwd and bwd; Ring P2P with zigzag and Ulysses (contiguous: Ulysses needs no balancing, and
    contiguous keeps its full-sequence local call a single causal rectangle)."""
    cells = []
    for mask, s, (hq, hk), p in itertools.product(("full", "causal"), (64 * K, 128 * K), ((64, 8), (64, 64)),
                                                  ("fwd", "bwd")):
        cells.append(_cell("ring_p2p", mask, s, hq, hk, p, 2, "zigzag", kernel))
        cells.append(_cell("ulysses", mask, s, hq, hk, p, 2, "contiguous", kernel))
    return cells


def h200_goal_single(kernel: str = "sdpa_cudnn") -> list[dict]:
    """The single-GPU baseline of h200_goal: the same local kernel on one GPU over the per-rank
    token count (a ring of one is exactly the local kernel on the whole mask)."""
    return [_cell("ring_p2p", mask, s, hq, hk, p, 1, "contiguous", kernel)
            for mask, s, (hq, hk), p in itertools.product(("full", "causal"), (32 * K, 64 * K), ((64, 8), (64, 64)),
                                                          ("fwd", "bwd"))]


def h200_masks(kernel: str = "flex") -> list[dict]:
    """Document and heterogeneous masks on 2 GPUs (FlexAttention local kernel: any sub-mask)."""
    cells = []
    for mask, s, p in itertools.product(("full_document", "causal_document", "share_question", "causal_blockwise"),
                                        (64 * K, 256 * K), ("fwd", "bwd")):
        for mech, bal in (("ring_p2p", "zigzag"), ("ring_p2p", "document"), ("ulysses", "contiguous"),
                          ("ring_allgather", "document")):
            cells.append(_cell(mech, mask, s, 64, 8, p, 2, bal, kernel))
    return cells


def cpu_smoke() -> list[dict]:
    """Every mechanism on 2 gloo CPU processes at a small size (pipeline test, not a result)."""
    return [_cell(m, mask, 512, 4, 2, "fwd_bwd", 2, "zigzag", "naive", device="cpu", dtype="float32",
                  warmup=1, iters=3, budget_s=20.0,
                  degrees={"usp": {"ulysses": 2, "ring": 1}, "loongtrain": {"ring": 2, "windows": 2}}.get(m))
            for m in ("ulysses", "ring_p2p", "ring_allgather", "usp", "loongtrain")
            for mask in ("causal", "causal_document")]


PRESETS: dict[str, Callable[[], list[dict]]] = {
    "h200_goal": h200_goal, "h200_goal_flash": lambda: h200_goal("sdpa_flash"),
    "h200_goal_single": h200_goal_single, "h200_goal_single_flash": lambda: h200_goal_single("sdpa_flash"),
    "h200_masks": h200_masks, "cpu_smoke": cpu_smoke,
}

"""The two dynamic masks: uniform and variable block sparsity, top-k key blocks per query block.

For every KV head and query block, the `density * n_k_blocks` rounded half up (at least 1) key blocks
with the highest score are kept, whole. Scores come from one of two sources:

- "random": i.i.d. uniform numbers, as the LongCA-bench paper did;
- "importance": mean-pooled q . k per block pair, from the cell's actual inputs, as NSA/MoBA-style
  methods select blocks. Queries are pooled over the query heads of each KV group and over the
  batch, so every batch element shares one layout (one mask per cell, as for every other mask).

"Density" is the fraction of blocks kept, per query block row. The exact area is kept blocks x
block areas (ragged last blocks included), see BlockLayout.area_per_head.
"""

from __future__ import annotations

import numpy as np

from longca.masks.blocks import BlockLayout

SCORE_SOURCES = ("random", "importance")


def uniform_bounds(seqlen: int, block: int) -> np.ndarray:
    return np.append(np.arange(0, seqlen, block, dtype=np.int64), np.int64(seqlen))


def variable_bounds(seqlen: int, min_block: int, mean_block: int, rng: np.random.Generator) -> np.ndarray:
    """Block sizes min_block + Exp(mean_block - min_block), rounded; the last block is truncated."""
    if mean_block < min_block:
        raise ValueError(f"mean_block={mean_block} must be >= min_block={min_block}")
    sizes: list[int] = []
    total = 0
    while total < seqlen:
        extra = rng.exponential(mean_block - min_block, size=64) if mean_block > min_block else np.zeros(64)
        for x in np.rint(min_block + extra).astype(np.int64):
            x = int(min(x, seqlen - total))
            sizes.append(x)
            total += x
            if total >= seqlen:
                break
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def keep_count(density: float, n_k_blocks: int) -> int:
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density={density!r} is outside (0, 1]")
    return int(min(n_k_blocks, max(1, np.floor(density * n_k_blocks + 0.5))))  # half rounds up


def random_scores(heads: int, nq: int, nk: int, rng: np.random.Generator) -> np.ndarray:
    return rng.random((heads, nq, nk))


def importance_scores(q, k, q_bounds: np.ndarray, k_bounds: np.ndarray, heads_kv: int) -> np.ndarray:
    """Mean-pooled q . k per (KV head, query block, key block). q, k: torch tensors in bshd.

    Computed on the inputs' device in float32; returns a numpy (heads_kv, nq, nk) array.
    """
    import torch

    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"inputs must be bshd 4-d tensors; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    b, sq, hq, d = q.shape
    _, sk, hk, _ = k.shape
    if hk != heads_kv or hq % hk:
        raise ValueError(f"inputs: q heads {hq} and k heads {hk} do not match heads_kv={heads_kv}")
    if sq != int(q_bounds[-1]) or sk != int(k_bounds[-1]):
        raise ValueError(f"inputs: seqlen q={sq}, k={sk} do not match the mask ({q_bounds[-1]}, {k_bounds[-1]})")

    def pool(x, bounds, groups: int):
        # x: (b, s, h, d) -> mean over batch, heads of a group and block tokens: (heads_kv, nblocks, d)
        x = x.float().reshape(x.shape[0], x.shape[1], heads_kv, groups, x.shape[-1]).sum(dim=(0, 3))
        sizes = torch.as_tensor(np.diff(bounds), device=x.device)
        block_id = torch.repeat_interleave(torch.arange(len(sizes), device=x.device), sizes)
        out = torch.zeros(len(sizes), heads_kv, x.shape[-1], device=x.device, dtype=torch.float32)
        out.index_add_(0, block_id, x)
        out /= (sizes * b * groups).to(torch.float32)[:, None, None]
        return out.transpose(0, 1)

    with torch.no_grad():
        qp = pool(q, q_bounds, hq // hk)
        kp = pool(k, k_bounds, 1)
        scores = torch.einsum("hid,hjd->hij", qp, kp)
    return scores.cpu().numpy()


def top_k_kept(scores: np.ndarray, keep: int) -> np.ndarray:
    """Boolean (heads, nq, nk): per row the `keep` highest scores, ties broken by the lower block index.

    The same set a stable descending argsort's first `keep` columns give, in linear time: a
    selection finds each row's keep-th largest value, everything above it is kept and the
    lowest-indexed entries equal to it fill the rest (a full sort took 18 s of a 256K block-64
    cell's mask build, 8 heads x 4096 x 4096 scores)."""
    nk = scores.shape[-1]
    if keep >= nk:
        return np.ones(scores.shape, dtype=bool)
    kept = np.empty(scores.shape, dtype=bool)
    buf = np.empty(scores.shape[1:], dtype=scores.dtype)  # one head at a time, one buffer for all
    for h in range(scores.shape[0]):
        s = scores[h]
        buf[...] = s
        # In-place selection: the keep-th largest lands at position nk - keep of each row.
        buf.partition(nk - keep, axis=-1)
        thr = buf[:, nk - keep : nk - keep + 1]
        k = np.greater(s, thr, out=kept[h])
        ties = s == thr
        need = keep - k.sum(axis=-1)
        over = ties.sum(axis=-1) > need  # rows where the threshold value repeats beyond what is needed
        if over.any():
            rows = ties[over]
            ties[over] = rows & (np.cumsum(rows, axis=-1, dtype=np.int32) <= need[over][:, None])
        k |= ties
    return kept


def top_k_layout(
    scores: np.ndarray, q_bounds: np.ndarray, k_bounds: np.ndarray, density: float, uniform_block: int | None
) -> BlockLayout:
    """Keep the top `keep_count` key blocks per (head, query block); ties broken by block index."""
    kept = top_k_kept(scores, keep_count(density, scores.shape[-1]))
    return BlockLayout(q_bounds, k_bounds, kept, uniform_block)


def layout(
    seqlen: int,
    q_bounds: np.ndarray,
    k_bounds: np.ndarray,
    *,
    density: float,
    score: str,
    heads_kv: int,
    rng: np.random.Generator,
    inputs=None,
    uniform_block: int | None = None,
) -> BlockLayout:
    if score == "random":
        scores = random_scores(heads_kv, len(q_bounds) - 1, len(k_bounds) - 1, rng)
    elif score == "importance":
        if inputs is None:
            raise ValueError("score='importance' needs the cell's inputs: build_mask(..., inputs=(q, k))")
        scores = importance_scores(inputs[0], inputs[1], q_bounds, k_bounds, heads_kv)
    else:
        raise ValueError(f"score={score!r}; allowed: {list(SCORE_SOURCES)}")
    return top_k_layout(scores, q_bounds, k_bounds, density, uniform_block)

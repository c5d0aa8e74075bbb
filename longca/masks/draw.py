"""Pictures of masks at block resolution (fraction of pairs attended per cell) and a gallery.

A picture never materialises S x S: cells are blocks of ceil(S / cells) tokens and their exact
attended counts come from the slices (flex.mask_block_counts). Rendered with Altair; PNG and SVG
go through vl-convert.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from longca.masks.flex import mask_block_counts
from longca.masks.mask import Mask
from longca.masks.registry import PATTERNS, build_mask


def block_fractions(mask: Mask, cells: int = 128, head: int = 0) -> tuple[np.ndarray, int]:
    """(fraction of pairs attended per cell, cell size in tokens) for one KV head."""
    block = max(1, -(-max(mask.seqlen_q, mask.seqlen_k) // cells))
    counts = mask_block_counts(mask, block, block)[min(head, mask.heads - 1)]
    nq, nk = counts.shape
    rows = np.minimum(np.arange(1, nq + 1) * block, mask.seqlen_q) - np.arange(nq) * block
    cols = np.minimum(np.arange(1, nk + 1) * block, mask.seqlen_k) - np.arange(nk) * block
    return counts / (rows[:, None] * cols[None, :]), block


def chart(mask: Mask, cells: int = 128, size: int = 320, title: str | None = None):
    """An Altair heat map: query blocks down, key blocks across, colour = fraction attended."""
    import altair as alt

    frac, block = block_fractions(mask, cells)
    i, j = np.nonzero(frac > 0)
    values = [
        {
            "q": int(a) * block,
            "k": int(b) * block,
            "q2": min(int(a + 1) * block, mask.seqlen_q),
            "k2": min(int(b + 1) * block, mask.seqlen_k),
            "fraction": round(float(frac[a, b]), 4),
        }
        for a, b in zip(i, j)
    ]
    scale_q = alt.Scale(domain=[0, mask.seqlen_q], nice=False, reverse=True)
    scale_k = alt.Scale(domain=[0, mask.seqlen_k], nice=False)
    head = " (KV head 0)" if mask.per_head else ""
    return (
        alt.Chart(alt.Data(values=values))
        .mark_rect()
        .encode(
            x=alt.X("k:Q", scale=scale_k, title="key position"),
            x2="k2:Q",
            y=alt.Y("q:Q", scale=scale_q, title="query position"),
            y2="q2:Q",
            color=alt.Color("fraction:Q", scale=alt.Scale(domain=[0, 1], scheme="blues"), title="attended"),
            tooltip=["q:Q", "k:Q", "fraction:Q"],
        )
        .properties(
            width=size, height=size, title=title or f"{mask.name}{head}: S={mask.seqlen_q}, density {mask.density:.3f}"
        )
    )


def draw(mask: Mask, out: str | Path, cells: int = 128, size: int = 320) -> Path:
    """Write the picture; the format follows the suffix: .png, .svg, .html or .json (Vega-Lite)."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in (".png", ".svg", ".html", ".json"):
        raise ValueError(f"--out {str(out)!r}: suffix {suffix!r} not allowed; allowed: .png, .svg, .html, .json")
    out.parent.mkdir(parents=True, exist_ok=True)
    chart(mask, cells, size).save(str(out))
    return out


def gallery(
    out_dir: str | Path,
    seqlen: int = 4096,
    *,
    seed: int = 0,
    fmt: str = "svg",
    cells: int = 64,
    params: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One picture per pattern (all 14) plus index.json describing them; returns the index.

    `params` overrides per pattern (e.g. {"sliding_window": {"window": 256}}); by default each
    pattern's `gallery` parameters (windows and blocks scaled to S/16 or so, so that the structure
    is visible at any S); documents follow the default ("auto") distribution."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = []
    for name, pat in PATTERNS.items():
        p = (params or {}).get(name, pat.gallery(seqlen) if pat.gallery else {})
        mask = build_mask(name, seqlen, p, seed=seed)
        path = draw(mask, out_dir / f"{name}.{fmt}", cells=cells, size=240)
        index.append(
            {
                "name": name,
                "family": pat.family,
                "description": pat.description,
                "file": path.name,
                "seqlen": seqlen,
                "seed": seed,
                "params": mask.params,
                "area": mask.area,
                "density": mask.density,
                "num_documents": mask.num_documents,
            }
        )
    (out_dir / "index.json").write_text(json.dumps(index, indent=1, default=str))
    return index

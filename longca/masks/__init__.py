"""Attention masks as data: (q_range, k_range, kind) slices, the 14 patterns, and their forms."""

from __future__ import annotations

from pathlib import Path


def gallery(out_dir: str | Path, seqlen: int = 4096, **kwargs) -> dict[str, Path]:
    """Draw every pattern into out_dir (plus index.json); returns {pattern name: image path}.

    See longca.masks.draw.gallery for the options (seed, fmt, cells, params)."""
    from longca.masks.draw import gallery as draw_gallery

    index = draw_gallery(out_dir, seqlen, **kwargs)
    return {e["name"]: Path(out_dir) / e["file"] for e in index}

"""The mask gallery page's images, built by longca.masks when it offers a gallery function.

The masks package owns how a mask pattern is drawn; the report only asks for the images in a folder
and links them. Expected: `longca.masks.gallery(out_dir)` (or a module longca.masks.gallery with a
function `gallery`) writing image files and returning their paths, or a {name: path} mapping.

longca's own gallery depends only on the mask code and the renderer, not on any result row, and
drawing it takes about 11 s on a 2-core machine: it is kept once per user
(~/.cache/longca/gallery-<fingerprint>, the fingerprint of longca.masks' sources and the Altair
and vl-convert versions) and copied into each report, like the Vega bundle.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

IMAGE_SUFFIXES = (".svg", ".png", ".jpg", ".jpeg", ".webp")


def find() -> Callable[..., Any] | None:
    try:
        masks = importlib.import_module("longca.masks")
    except ImportError:
        return None
    fn = getattr(masks, "gallery", None)
    if fn is None:
        try:
            fn = importlib.import_module("longca.masks.gallery")
        except ImportError:
            return None
    if not callable(fn):
        fn = getattr(fn, "gallery", None)
    return fn if callable(fn) else None


def build(out: Path) -> tuple[list[tuple[str, str]], str]:
    """Images as (path relative to the report root, caption), and a message when there are none."""
    fn = find()
    if fn is None:
        return [], "No gallery images were built: this longca has no mask gallery function (longca.masks.gallery)."
    d = out / "gallery"
    d.mkdir(parents=True, exist_ok=True)
    cache = _cache_dir() if _is_own(fn) else None
    if cache is not None and (cache / "index.json").is_file():
        shutil.copytree(cache, d, dirs_exist_ok=True)
        result = _from_index(d)
    else:
        try:  # PNG: a 64 x 64-block picture is ~20x smaller as PNG than as SVG rectangles
            result = fn(d, fmt="png")
        except TypeError:
            result = fn(d)
        if cache is not None:
            _keep(d, cache)
    if isinstance(result, dict):
        items = [(str(k), Path(v)) for k, v in result.items()]
    elif result:
        items = [(Path(p).stem, Path(p)) for p in result]
    else:
        items = [(p.stem, p) for p in sorted(d.rglob("*")) if p.suffix.lower() in IMAGE_SUFFIXES]
    captions = _captions(d / "index.json")
    images = []
    for name, p in items:
        p = p if p.is_absolute() else (d / p if not p.exists() else p)
        try:
            rel = p.resolve().relative_to(out.resolve())
        except ValueError:  # an image outside the report would not travel with it
            continue
        images.append((rel.as_posix(), captions.get(name, name)))
    if not images:
        return [], "No gallery images were built: the mask gallery function wrote no images."
    return images, ""


def _is_own(fn: Callable[..., Any]) -> bool:
    try:
        return fn is importlib.import_module("longca.masks").gallery
    except (ImportError, AttributeError):
        return False


def _cache_dir() -> Path:
    import altair
    import vl_convert

    import longca.masks

    h = hashlib.sha256(f"altair {altair.__version__} vl-convert {vl_convert.__version__}".encode())
    for p in sorted(Path(longca.masks.__file__).parent.rglob("*.py")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "longca"
    return root / f"gallery-{h.hexdigest()[:16]}"


def _keep(built: Path, cache: Path) -> None:
    """Copy a freshly drawn gallery into the cache, whole or not at all (rename of a full copy)."""
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        shutil.copytree(built, tmp, dirs_exist_ok=True)
        os.replace(tmp, cache)
    except OSError:  # another build kept it first, or no writable cache: the report is unaffected
        shutil.rmtree(tmp, ignore_errors=True)


def _from_index(d: Path) -> dict[str, Path]:
    """{name: image} in the gallery's own order, from its index.json."""
    entries = json.loads((d / "index.json").read_text(encoding="utf-8"))
    return {str(e["name"]): d / e["file"] for e in entries}


def _captions(index: Path) -> dict[str, str]:
    """'name: description (S=..., density ...)' from the gallery's index.json, when it wrote one."""
    try:
        entries = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    out = {}
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and "name" in e:
            extra = ", ".join(
                f"{k} {e[k]:.3g}" if isinstance(e[k], float) else f"{k} {e[k]}"
                for k in ("seqlen", "density")
                if e.get(k) is not None
            )
            out[str(e["name"])] = f"{e['name']}: {e.get('description', '')}" + (f" ({extra})" if extra else "")
    return out

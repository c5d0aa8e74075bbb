"""`longca masks`: list the patterns, print a mask's statistics, draw a mask or the gallery."""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from longca.vocab import parse_seqlen


def _parse_sets(items: list[str] | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value")
        key, value = item.split("=", 1)
        params[key.strip()] = None if value.strip().lower() in ("none", "null") else value.strip()
    return params


def _build(args):
    from longca.masks.registry import build_mask

    return build_mask(
        args.name, args.seqlen, _parse_sets(args.set), seed=args.seed, sample=args.sample, heads_kv=args.heads_kv
    )


def _list(args) -> int:
    from longca.masks.registry import PATTERNS

    rows = []
    for name, p in PATTERNS.items():
        rows.append(
            {
                "name": name,
                "family": p.family,
                "description": p.description,
                "forms": sorted(p.forms),
                "default_samples": p.default_samples,
                "params": {q.name: {"default": q.default, "help": q.help} for q in p.params},
            }
        )
    if args.json:
        print(json.dumps(rows, indent=1, default=str))
        return 0
    for r in rows:
        params = ", ".join(f"{k}={v['default']}" for k, v in r["params"].items()) or "-"
        print(f"{r['name']:<24} {r['family']:<14} {r['description']}")
        print(f"{'':<24} params: {params}; forms: {', '.join(r['forms'])}")
    return 0


def stats(mask) -> dict[str, Any]:
    """The JSON-able statistics of a mask (what `longca masks stats --json` prints)."""
    out: dict[str, Any] = {
        "name": mask.name,
        "seqlen_q": mask.seqlen_q,
        "seqlen_k": mask.seqlen_k,
        "params": mask.params,
        "area": mask.area,
        "area_per_head": mask.area_per_head,
        "density": mask.density,
        "num_documents": mask.num_documents,
        "documents": list(mask.documents) if mask.documents else None,
    }
    if mask.blocks is not None:
        b = mask.blocks
        out["heads_kv"] = b.heads
        out["area_of_heads"] = b.area_per_head().tolist()
        out["q_bounds"] = b.q_bounds.tolist()
        out["k_bounds"] = b.k_bounds.tolist()
        out["kept_blocks"] = [np.argwhere(b.kept[h]).tolist() for h in range(b.heads)]
    else:
        out["slice_columns"] = ["q0", "q1", "k0", "k1", "kind"]
        out["slices"] = mask.slices.tolist()
    return out


def _stats(args) -> int:
    data = stats(_build(args))
    if args.json:
        print(json.dumps(data, default=str))
        return 0
    print(f"{data['name']}  S={data['seqlen_q']}  params={json.dumps(data['params'], default=str)}")
    print(f"area {data['area']}  density {data['density']:.6f}  documents {data['num_documents']}")
    if "slices" in data:
        print(f"{len(data['slices'])} slices (q0, q1, k0, k1, kind: 0 full, 1 causal, 2 invcausal, 3 bicausal)")
        for row in data["slices"][:20]:
            print("  ", row)
        if len(data["slices"]) > 20:
            print(f"   ... {len(data['slices']) - 20} more (use --json)")
    return 0


def _draw(args) -> int:
    from longca.masks.draw import draw

    path = draw(_build(args), args.out, cells=args.cells)
    print(path)
    return 0


def _gallery(args) -> int:
    from longca.masks.draw import gallery

    index = gallery(args.out_dir, args.seqlen, seed=args.seed, fmt=args.format, cells=args.cells)
    print(f"{len(index)} masks drawn in {args.out_dir}")
    return 0


def _length(text: str) -> int:
    """A length as specs write it ('32K'); argparse reports the ValueError as an invalid value."""
    try:
        return parse_seqlen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _mask_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="mask pattern (see `longca masks list`)")
    p.add_argument("--seqlen", type=_length, required=True, help="sequence length S (1024, 32K, 1M)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="mask parameter (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample", type=int, default=0, help="sample index of a sampled mask")
    p.add_argument("--heads-kv", type=int, default=None, help="KV heads (block-sparse layouts per head)")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("masks", help="list, inspect and draw attention masks")
    sub = parser.add_subparsers(dest="masks_command", required=True)

    p = sub.add_parser("list", help="list the mask patterns")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_list)

    p = sub.add_parser("stats", help="area, density, documents and slices of one mask")
    _mask_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_stats)

    p = sub.add_parser("draw", help="draw a mask at block resolution (.png, .svg, .html, .json)")
    _mask_args(p)
    p.add_argument("--out", required=True)
    p.add_argument("--cells", type=int, default=128, help="cells per side")
    p.set_defaults(func=_draw)

    p = sub.add_parser("gallery", help="draw every pattern and write index.json")
    p.add_argument("out_dir")
    p.add_argument("--seqlen", type=_length, default=4096, help="sequence length S (1024, 32K, 1M)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=("svg", "png", "html", "json"), default="svg")
    p.add_argument("--cells", type=int, default=64)
    p.set_defaults(func=_gallery)

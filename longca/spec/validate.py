"""Semantic checks the JSON schema cannot express: names that must exist, shapes that must divide."""

from __future__ import annotations

import math
from typing import Any

from longca.spec.load import Spec, SpecError, parse_seqlen

CP_MECHANISMS = ("ulysses", "ring_p2p", "ring_allgather", "usp", "loongtrain")


def _dupes(values: tuple, where: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise SpecError(where, f"value {v!r} appears twice; each axis value must be unique")
        seen.add(v)


def check_mask_params(name: str, params: dict[str, Any], where: str) -> None:
    from longca.masks.registry import PATTERNS

    if name not in PATTERNS:
        raise SpecError(f"{where}.name" if params else where, f"unknown mask {name!r}; allowed: {sorted(PATTERNS)}")
    pattern = PATTERNS[name]
    declared = {p.name: p for p in pattern.params}
    for key, value in params.items():
        if key not in declared:
            raise SpecError(f"{where}.{key}", f"mask {name!r} has no parameter {key!r}; allowed: {sorted(declared) or 'none'}")
        p = declared[key]
        if hasattr(p, "coerce"):  # the pattern's own typed check (types, bounds, choices, names)
            try:
                p.coerce(name, value)
            except ValueError as exc:
                raise SpecError(f"{where}.{key}", str(exc)) from None
            continue
        ok = isinstance(value, p.type) and not (p.type is int and isinstance(value, bool))
        if p.type is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise SpecError(f"{where}.{key}", f"{value!r} is not of type {p.type.__name__}")
        if p.minimum is not None and value < p.minimum:
            raise SpecError(f"{where}.{key}", f"{value!r} is below the minimum {p.minimum}")
        if p.choices is not None and value not in p.choices:
            raise SpecError(f"{where}.{key}", f"{value!r} is not allowed; allowed: {list(p.choices)}")


def check_spec(spec: Spec) -> None:
    from longca.kernels.registry import load_all

    kernels = load_all()
    for i, sw in enumerate(spec.sweeps):
        where = f"sweeps.{i}"
        for axis in ("kernels", "seqlens", "heads", "head_dims", "dtypes", "passes", "batch"):
            _dupes(getattr(sw, axis), f"{where}.{axis}")
        _dupes(tuple((m.name, m.params) for m in sw.masks), f"{where}.masks")
        for j, k in enumerate(sw.kernels):
            if k not in kernels:
                raise SpecError(f"{where}.kernels.{j}", f"unknown kernel {k!r}; allowed: {sorted(kernels)}")
        for j, m in enumerate(sw.masks):
            check_mask_params(m.name, m.params_dict, f"{where}.masks.{j}")
        for j, (hq, hkv) in enumerate(sw.heads):
            if hq < 1 or hkv < 1:
                raise SpecError(f"{where}.heads.{j}", f"'{hq}:{hkv}': head counts must be at least 1")
            if hq % hkv:
                raise SpecError(f"{where}.heads.{j}",
                                f"'{hq}:{hkv}': query heads must be a multiple of KV heads (GQA groups)")
        for j, d in enumerate(sw.head_dims):
            if d % 8:
                raise SpecError(f"{where}.head_dims.{j}", f"{d}: head dims must be multiples of 8")
        rep = sw.repeat
        if "warmup_s" in rep:
            w = rep["warmup_s"]
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w < math.inf):
                raise SpecError(f"{where}.repeat.warmup_s",
                                f"{w!r}: the warm-up time budget must be a positive, finite number of seconds")
        if sw.cp is not None and rep.get("backward") == "fresh_forward":
            raise SpecError(f"{where}.repeat.backward",
                            "'fresh_forward' is not available to context-parallel sweeps: their backward is "
                            "always timed on one forward's graph (allowed here: retained_graph)")
        if rep.get("min_iters", 1) > rep.get("iters", 1):
            raise SpecError(f"{where}.repeat.min_iters",
                            f"{rep['min_iters']} exceeds repeat.iters={rep['iters']}; min_iters must be <= iters")
        _check_excludes(sw, where)
        if sw.cp is not None:
            _check_cp(spec, sw, where)
    if spec.check.get("max_seqlen", 1) < 16:
        raise SpecError("check.max_seqlen", f"{spec.check['max_seqlen']}: must be at least 16")


def _check_excludes(sw, where: str) -> None:
    axis_values = {
        "kernel": set(sw.kernels), "mask": {m.name for m in sw.masks}, "seqlen": set(sw.seqlens),
        "heads": {f"{a}:{b}" for a, b in sw.heads}, "head_dim": set(sw.head_dims), "dtype": set(sw.dtypes),
        "pass": set(sw.passes), "batch": set(sw.batch),
    }
    if sw.cp:
        axis_values["cp_mechanism"] = set(sw.cp["mechanisms"])
        axis_values["world_size"] = set(sw.cp["world_sizes"])
    for j, rule in enumerate(sw.exclude):
        for key, value in rule.items():
            if key not in axis_values:
                raise SpecError(f"{where}.exclude.{j}.{key}", f"this sweep has no axis {key!r}; allowed: {sorted(axis_values)}")
            v = parse_seqlen(value, f"{where}.exclude.{j}.seqlen") if key == "seqlen" else value
            if key == "dtype":
                from longca.spec.load import DTYPE_ALIASES

                v = DTYPE_ALIASES.get(v, v)
            if v not in axis_values[key]:
                raise SpecError(f"{where}.exclude.{j}.{key}",
                                f"{value!r} is not a value of this sweep's axis; allowed: {sorted(map(str, axis_values[key]))}")


def _check_cp(spec: Spec, sw, where: str) -> None:
    from longca.cp.bench import DTYPES as CP_DTYPES

    cp = sw.cp
    for j, d in enumerate(sw.dtypes):
        if d not in CP_DTYPES:
            raise SpecError(f"{where}.dtypes.{j}",
                            f"{d!r} is not available to context-parallel sweeps; allowed: {sorted(CP_DTYPES)}")
    backend = cp.get("backend", "auto")
    if spec.device == "cpu" and backend == "nccl":
        raise SpecError(f"{where}.cp.backend", "'nccl' needs device: cuda; allowed on cpu: ['auto', 'gloo']")
    for j, w in enumerate(cp["world_sizes"]):
        if w < 2:
            raise SpecError(f"{where}.cp.world_sizes.{j}", f"{w}: context parallelism needs at least 2 processes")
        for s_i, s in enumerate(sw.seqlens):
            if s % (2 * w):
                raise SpecError(f"{where}.seqlens.{s_i}",
                                f"{s} is not divisible by 2 x world size ({2 * w}); zigzag sharding splits "
                                f"the sequence into 2 x world_size chunks")
    for j, d in enumerate(cp.get("ulysses_degrees", []) or []):
        if not any(w % d == 0 for w in cp["world_sizes"]):
            raise SpecError(f"{where}.cp.ulysses_degrees.{j}", f"{d} divides none of world_sizes {cp['world_sizes']}")

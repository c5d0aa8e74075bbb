"""Semantic checks the JSON schema cannot express: names that must exist, shapes that must divide."""

from __future__ import annotations

import itertools
import math
from typing import Any

from longca.cp.mechanisms import resolve_degrees
from longca.cp.sharding import granule
from longca.cp.ulysses import kv_replication
from longca.kernels import registry
from longca.kernels.base import Unsupported
from longca.masks.registry import PATTERNS, resolve_params
from longca.spec.cells import cp_layouts, excluded, resolve_balance
from longca.spec.model import Spec, SpecError, parse_seqlen
from longca.vocab import CP_DTYPES, Balance, normalise


def _dupes(values: tuple, where: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise SpecError(where, f"value {v!r} appears twice; each axis value must be unique")
        seen.add(v)


def check_mask_params(name: str, params: dict[str, Any], where: str) -> None:
    if name not in PATTERNS:
        raise SpecError(f"{where}.name" if params else where, f"unknown mask {name!r}; allowed: {sorted(PATTERNS)}")
    pattern = PATTERNS[name]
    declared = {p.name: p for p in pattern.params}
    for key, value in params.items():
        if key not in declared:
            raise SpecError(
                f"{where}.{key}", f"mask {name!r} has no parameter {key!r}; allowed: {sorted(declared) or 'none'}"
            )
        try:  # the parameter's own typed check (types, bounds, choices, names)
            declared[key].coerce(name, value)
        except ValueError as exc:
            raise SpecError(f"{where}.{key}", str(exc)) from None


def check_spec(spec: Spec) -> None:
    kernels = registry.load_all()
    if spec.gpu_model is not None and spec.device != "cuda":
        raise SpecError(
            "gpu_model",
            f"{spec.gpu_model!r} names a GPU model, but device is {spec.device!r}; allowed only with device: cuda",
        )
    for j, k in enumerate(spec.check.get("agree_with", ())):
        if k not in kernels:
            raise SpecError(f"check.agree_with.{j}", f"unknown kernel {k!r}; allowed: {sorted(kernels)}")
    _dupes(tuple(spec.check.get("agree_with", ())), "check.agree_with")
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
                raise SpecError(
                    f"{where}.heads.{j}", f"'{hq}:{hkv}': query heads must be a multiple of KV heads (GQA groups)"
                )
        for j, d in enumerate(sw.head_dims):
            if d % 8:
                raise SpecError(f"{where}.head_dims.{j}", f"{d}: head dims must be multiples of 8")
        rep = sw.repeat
        if "warmup_s" in rep:
            w = rep["warmup_s"]
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0 < w < math.inf):
                raise SpecError(
                    f"{where}.repeat.warmup_s",
                    f"{w!r}: the warm-up time budget must be a positive, finite number of seconds",
                )
        if sw.cp is not None and rep.get("backward") == "fresh_forward":
            raise SpecError(
                f"{where}.repeat.backward",
                "'fresh_forward' is not available to context-parallel sweeps: their backward is "
                "always timed on one forward's graph (allowed here: retained_graph)",
            )
        if rep.get("min_iters", 1) > rep.get("iters", 1):
            raise SpecError(
                f"{where}.repeat.min_iters",
                f"{rep['min_iters']} exceeds repeat.iters={rep['iters']}; min_iters must be <= iters",
            )
        _check_excludes(sw, where)
        _check_cells_left(sw, where)
        _check_mask_fits(sw, where)
        if sw.cp is not None:
            _check_cp(spec, sw, where)
    if spec.check.get("max_seqlen", 1) < 16:
        raise SpecError("check.max_seqlen", f"{spec.check['max_seqlen']}: must be at least 16")


def _check_excludes(sw, where: str) -> None:
    axis_values = {
        "kernel": set(sw.kernels),
        "mask": {m.name for m in sw.masks},
        "seqlen": set(sw.seqlens),
        "heads": {f"{a}:{b}" for a, b in sw.heads},
        "head_dim": set(sw.head_dims),
        "dtype": set(sw.dtypes),
        "pass": set(sw.passes),
        "batch": set(sw.batch),
    }
    if sw.cp:
        axis_values["cp_mechanism"] = set(sw.cp["mechanisms"])
        axis_values["world_size"] = set(sw.cp["world_sizes"])
    for j, rule in enumerate(sw.exclude):
        for key, value in rule.items():
            if key not in axis_values:
                raise SpecError(
                    f"{where}.exclude.{j}.{key}", f"this sweep has no axis {key!r}; allowed: {sorted(axis_values)}"
                )
            v = parse_seqlen(value, f"{where}.exclude.{j}.seqlen") if key == "seqlen" else value
            if key == "dtype":
                v = normalise(key, v)
            if v not in axis_values[key]:
                raise SpecError(
                    f"{where}.exclude.{j}.{key}",
                    f"{value!r} is not a value of this sweep's axis; allowed: {sorted(map(str, axis_values[key]))}",
                )


def _check_cells_left(sw, where: str) -> None:
    """A sweep whose `exclude` rules remove every combination of its axes is a mistake, not a
    sweep of no cells: name the rules."""
    if not sw.exclude:
        return
    cps = [(m, w) for m in sw.cp["mechanisms"] for w in sw.cp["world_sizes"]] if sw.cp else [(None, 1)]
    combos = itertools.product(
        sw.kernels, sw.masks, sw.seqlens, sw.heads, sw.head_dims, sw.dtypes, sw.passes, sw.batch, cps
    )
    for k, m, s, (hq, hkv), d, dt, p, b, (mech, world) in combos:
        values = {"kernel": k, "mask": m.name, "seqlen": s, "heads": f"{hq}:{hkv}", "head_dim": d, "dtype": dt}
        values.update({"pass": p, "batch": b, "cp_mechanism": mech, "world_size": world})
        if not excluded(sw, values):
            return
    raise SpecError(
        f"{where}.exclude",
        f"its {len(sw.exclude)} rule(s) remove every cell of sweep {sw.name!r} ({sw.exclude}); "
        "allowed: rules that leave at least one cell, or drop the sweep",
    )


# Mask parameters that are lengths: a value beyond the sequence cannot mean what it says (a window
# past the sequence is the full mask, a block past it leaves one block and density 1).
LENGTH_PARAMS = ("window", "global_tokens", "prefix", "block", "min_block", "mean_block")


def _check_mask_fits(sw, where: str) -> None:
    """Every length-valued mask parameter fits each of the sweep's lengths it is measured at."""
    for j, m in enumerate(sw.masks):
        params = resolve_params(m.name, m.params_dict)
        for key in LENGTH_PARAMS:
            value = params.get(key)
            if value is None:
                continue
            for i, s in enumerate(sw.seqlens):
                if value > s and not _excluded_by_rule(sw, {"mask": m.name, "seqlen": s}):
                    given = "" if key in m.params_dict else " (its default)"
                    raise SpecError(
                        f"{where}.masks.{j}.{key}",
                        f"{value}{given} exceeds the sweep's length {s} (seqlens.{i}); allowed: at most the "
                        f"sequence length, or exclude that length for this mask",
                    )
        density = params.get("density")
        block = params.get("block") or params.get("mean_block")
        if density is None or not block:
            continue
        for i, s in enumerate(sw.seqlens):
            # top-k keeps round(density x key blocks) per query block, at least one: below half a
            # block the density asked for cannot be met (one block would be kept instead)
            n_blocks = math.ceil(s / block)
            if density * n_blocks < 0.5 and not _excluded_by_rule(sw, {"mask": m.name, "seqlen": s}):
                raise SpecError(
                    f"{where}.masks.{j}.density",
                    f"{density} keeps no key block at length {s} ({n_blocks} blocks of {block}; seqlens.{i}); "
                    f"allowed: at least {0.5 / n_blocks:.3g} at that length, a longer length, or exclude it",
                )


def _excluded_by_rule(sw, values: dict[str, Any]) -> bool:
    """Whether an `exclude` rule whose keys are all among `values` matches them (a combination of
    axis values checked below that no cell will have)."""
    return any(
        set(rule) <= set(values) and all(normalise(k, v) == normalise(k, values[k]) for k, v in rule.items())
        for rule in sw.exclude
    )


def _check_cp(spec: Spec, sw, where: str) -> None:
    """What a context-parallel sweep can only fail at, refused before any process starts: kernels
    that cannot be per-rank kernels, dtypes the mechanisms do not carry, world sizes without a
    degree split, heads the Ulysses degree does not divide, lengths a sharding cannot cut, and
    block-sparse masks no rank can score or balance."""
    cp = sw.cp
    for j, name in enumerate(sw.kernels):
        if registry.get(name).caps.cp is None:
            raise SpecError(
                f"{where}.kernels.{j}",
                f"{name!r} cannot be a context-parallel per-rank kernel (it must return the LSE and take "
                f"the combined output and LSE in its backward); allowed: {registry.rank_kernel_names()}",
            )
    for j, d in enumerate(sw.dtypes):
        if d not in CP_DTYPES:
            raise SpecError(
                f"{where}.dtypes.{j}",
                f"{d!r} is not available to context-parallel sweeps; allowed: {sorted(CP_DTYPES)}",
            )
    backend = cp.get("backend", "auto")
    if spec.device == "cpu" and backend == "nccl":
        raise SpecError(f"{where}.cp.backend", "'nccl' needs device: cuda; allowed on cpu: ['auto', 'gloo']")
    for j, d in enumerate(cp.get("ulysses_degrees", []) or []):
        if not any(w % d == 0 for w in cp["world_sizes"]):
            raise SpecError(f"{where}.cp.ulysses_degrees.{j}", f"{d} divides none of world_sizes {cp['world_sizes']}")
    for j, m in enumerate(sw.masks):
        if PATTERNS[m.name].family != "dynamic":
            continue
        params = resolve_params(m.name, m.params_dict)
        if params.get("score") != "random":
            raise SpecError(
                f"{where}.masks.{j}.score",
                f"{params.get('score')!r}: context-parallel cells draw each rank's inputs separately, so "
                f"scores of the global inputs do not exist; allowed: 'random'",
            )
        if cp.get("balance") == Balance.DOCUMENT:
            raise SpecError(
                f"{where}.cp.balance",
                f"'document' balances slice masks by row area, not the block-sparse "
                f"mask {m.name!r}; allowed here: auto, contiguous, zigzag",
            )
    for j, w in enumerate(cp["world_sizes"]):
        if w < 2:
            raise SpecError(f"{where}.cp.world_sizes.{j}", f"{w}: context parallelism needs at least 2 processes")
        for mech in cp["mechanisms"]:
            layouts = cp_layouts(mech, w, cp)
            if not layouts and not _excluded_by_rule(sw, {"cp_mechanism": mech, "world_size": w}):
                raise SpecError(
                    f"{where}.cp.world_sizes.{j}",
                    f"{w}: {mech} has no degree split at this world size (ulysses_degrees "
                    f"{cp.get('ulysses_degrees')}, loongtrain_windows {cp.get('loongtrain_windows')}); "
                    f"allowed: world sizes that one of those divides",
                )
            for degrees in layouts:
                _check_cp_layout(sw, where, mech, w, degrees, cp)


def _check_cp_layout(sw, where: str, mech: str, w: int, degrees: tuple, cp: dict[str, Any]) -> None:
    """One mechanism at one world size and degree split against the sweep's heads, masks and lengths."""
    try:
        u, _, _ = resolve_degrees(mech, w, dict(degrees))
    except ValueError as exc:
        raise SpecError(f"{where}.cp", f"{mech} at world_size {w}: {exc}") from None
    values = {"cp_mechanism": mech, "world_size": w}
    for k, (hq, hkv) in enumerate(sw.heads):
        if _excluded_by_rule(sw, {**values, "heads": f"{hq}:{hkv}"}):
            continue
        try:
            kv_replication(hq, hkv, u)
        except Unsupported as exc:
            raise SpecError(
                f"{where}.heads.{k}",
                f"'{hq}:{hkv}' cannot run {mech} at world_size {w} (Ulysses degree {u}): {exc}; allowed: "
                f"query heads divisible by {u}, KV heads divisible by {u} or dividing it",
            ) from None
    for m in sw.masks:
        balance = resolve_balance(cp.get("balance", Balance.AUTO), m.name, degrees)
        g = granule(balance, w)
        for i, s in enumerate(sw.seqlens):
            if s % g and not _excluded_by_rule(sw, {**values, "mask": m.name, "seqlen": s}):
                raise SpecError(
                    f"{where}.seqlens.{i}",
                    f"{s} is not divisible by {g}, which balance {balance!r} needs at world_size {w} "
                    f"({mech}, mask {m.name}); allowed: multiples of {g}",
                )

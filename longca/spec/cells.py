"""Expand a spec into frozen cells, each with a stable readable id and its own output path.

Paths are hive-style (`key=value/`) with keys that are also row columns holding the same values,
so DuckDB and Polars can read any subtree with hive partitioning and get identical columns.
The file name carries a digest of every field that defines the cell: changing a field that is not
in the path (repetitions, tolerances, seed) makes a new file, so only changed cells rerun.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from longca.kernels import registry
from longca.kernels.base import Kernel
from longca.masks.pattern import MaskPattern
from longca.masks.registry import PATTERNS
from longca.spec.model import LATE_TOLERANCES, MaskChoice, Spec, Sweep
from longca.vocab import Balance, Mechanism, Pass, axis_name, normalise

# The hive path's keys, in order: row columns that hold the same values (longca.run.rows), so a
# row alone says where its cell file lives (longca.store.aggregate.unpack restores it there).
PARTITION_KEYS = (
    "sweep",
    "kernel",
    "mask",
    "mask_variant",
    "seqlen_q",
    "heads_q",
    "heads_kv",
    "head_dim",
    "dtype",
    "pass",
    "batch",
)
CP_PARTITION_KEYS = (*PARTITION_KEYS, "world_size", "cp_mechanism", "cp_variant")  # a CP cell's
_FIELD = {"seqlen_q": "seqlen", "pass": "pass_"}  # row column -> Cell field where they differ


def cell_relpath(columns: dict[str, Any], digest: str) -> str:
    """A cell file's path under `<results>/<spec>/cells/`, from its partition columns (a row's or
    `Cell.partition`'s) and its digest."""
    keys = CP_PARTITION_KEYS if columns.get("cp_mechanism") is not None else PARTITION_KEYS
    return "/".join(f"{k}={columns[k]}" for k in keys) + f"/cell-{digest}.parquet"


def _variant(params: dict[str, Any]) -> str:
    if not params:
        return "default"
    return "_".join(f"{k}-{v}" for k, v in sorted(params.items())).replace("/", "-").replace("=", "-")


@dataclass(frozen=True)
class Cell:
    spec: str
    sweep: str
    kernel: str
    mask: str
    mask_params: tuple[tuple[str, Any], ...]
    seqlen: int
    heads_q: int
    heads_kv: int
    head_dim: int
    dtype: str
    pass_: str
    batch: int
    device: str
    seed: int
    samples: int
    repeat: tuple[tuple[str, Any], ...]
    check: str  # JSON of the check settings
    timeout_s: float
    world_size: int = 1
    cp_mechanism: str | None = None
    cp_degrees: tuple[tuple[str, int], ...] = ()
    cp_balance: str | None = None
    cp_backend: str | None = None

    @property
    def mask_variant(self) -> str:
        return _variant(dict(self.mask_params))

    @property
    def cp_variant(self) -> str | None:
        if self.cp_mechanism is None:
            return None
        parts = [f"{k}{v}" for k, v in self.cp_degrees] + ([self.cp_balance] if self.cp_balance else [])
        return "-".join(parts) or "default"

    @cached_property
    def adapter(self) -> Kernel:
        """The cell's kernel adapter, looked up once (KeyError naming the kernels for an unknown one)."""
        return registry.get(self.kernel)

    @cached_property
    def pattern(self) -> MaskPattern | None:
        """The cell's mask pattern, looked up once (None for a name no pattern has)."""
        return PATTERNS.get(self.mask)

    @cached_property  # frozen, so computed once: planning thousands of cells asks for it often
    def digest(self) -> str:
        payload = asdict(self)
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @property
    def partition(self) -> list[tuple[str, Any]]:
        keys = CP_PARTITION_KEYS if self.cp_mechanism is not None else PARTITION_KEYS
        return [(k, self.column(k)) for k in keys]

    def column(self, key: str) -> Any:
        """The cell's value of a row column that names a Cell field differently or derives from one."""
        return getattr(self, _FIELD.get(key, key))

    @property
    def id(self) -> str:
        """Readable and stable: the partition values joined, then the digest."""
        return "/".join(f"{k}={v}" for k, v in self.partition[1:]) + f"@{self.digest[:8]}"

    def relpath(self) -> str:
        return cell_relpath(dict(self.partition), self.digest)

    def output(self, results_dir: str | Path) -> str:
        return str(Path(results_dir) / self.spec / "cells" / self.relpath())

    def axis_value(self, key: str) -> Any:
        """The cell's value of a selection axis (longca.vocab.AXES; aliases such as seqlen_q accepted)."""
        name = axis_name(key)
        if name == "heads":
            return f"{self.heads_q}:{self.heads_kv}"
        return getattr(self, {"pass": "pass_"}.get(name, name))

    @property
    def repeat_dict(self) -> dict[str, Any]:
        return dict(self.repeat)

    @property
    def check_dict(self) -> dict[str, Any]:
        return json.loads(self.check)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["id"] = self.id
        d["digest"] = self.digest
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Cell:
        d = {k: v for k, v in d.items() if k not in ("id", "digest")}
        for key in ("mask_params", "repeat", "cp_degrees"):
            d[key] = tuple(tuple(x) for x in d[key])
        return cls(**d)


def _samples(sw: Sweep, mask: MaskChoice) -> int:
    counts = sw.mask_samples
    pat = PATTERNS[mask.name]
    if pat.multi_document:
        return int(counts["multi_document"])
    return int(counts["single"]) if pat.sampled else 1


def excluded(sw: Sweep, values: dict[str, Any]) -> bool:
    """Whether an `exclude` rule of the sweep matches every one of its keys (values normalised)."""
    return any(
        all(normalise(key, want) == normalise(key, values[axis_name(key)]) for key, want in rule.items())
        for rule in sw.exclude
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def cp_layouts(mechanism: str, world: int, cp: dict[str, Any]) -> list[tuple[tuple[str, int], ...]]:
    """Degree splits to measure for one mechanism at one world size."""
    if mechanism == Mechanism.ULYSSES:
        return [(("ulysses", world),)]
    if mechanism in (Mechanism.RING_P2P, Mechanism.RING_ALLGATHER):
        return [(("ring", world),)]
    if mechanism == Mechanism.USP:
        degrees = cp.get("ulysses_degrees") or _divisors(world)
        return [(("ulysses", d), ("ring", world // d)) for d in degrees if world % d == 0]
    if mechanism == Mechanism.LOONGTRAIN:
        windows = cp.get("loongtrain_windows") or _divisors(world)
        return [(("ring", world), ("windows", w)) for w in windows if world % w == 0]
    raise ValueError(f"unknown CP mechanism {mechanism!r}")


def resolve_balance(balance: str, mask: str, degrees: tuple = ()) -> str:
    """`auto` sharding: area balance (`document`) for document masks and the heterogeneous family,
    zigzag for the regular masks whose work grows along the sequence (causal, causal sliding
    window: zigzag evens them exactly), contiguous where every rank has equal work anyway
    (full, sliding window, and block-sparse masks, which keep the same number of key blocks in
    every query block: zigzag would only cut more blocks at shard boundaries). Zigzag left the
    heterogeneous masks uneven: at 256K on 2 ranks prefix_lm_causal's busiest rank 9.8% above the
    mean (on one H200, 2026-12-02: 22% more area on one rank) and global_sliding_window's 9.5%,
    against 0.7% and 0.5% under `document` (docs/cp.md, "Load balance"); auto chose zigzag for them before.

    Without a ring (`degrees` has no ring degree above 1: pure Ulysses) every rank attends the
    whole sequence for its heads, so work is equal under any sharding, and contiguous keeps the
    gathered sequence in its natural order: the mask stays one slice list (one causal call for
    causal) instead of a permuted one cut into several calls merged by log-sum-exp."""
    if balance != Balance.AUTO:
        return balance
    if dict(degrees).get("ring", 1) == 1:
        return "contiguous"
    if PATTERNS[mask].multi_document or PATTERNS[mask].family == "heterogeneous":
        return "document"
    if mask in ("full", "sliding_window") or PATTERNS[mask].family == "dynamic":
        return "contiguous"
    return "zigzag"


def resolve_backend(backend: str, device: str) -> str:
    if backend != "auto":
        return backend
    return "nccl" if device == "cuda" else "gloo"


def unknown_sweep(name: str, spec_name: str, names: Iterable[str]) -> str | None:
    """The error for a --sweep value that is none of `names` (the spec's sweeps), naming the
    allowed ones; None when it is one of them."""
    names = sorted(set(names))
    return None if name in names else f"--sweep {name!r}: no such sweep in {spec_name!r}; allowed: {', '.join(names)}"


def comparators(agree_with: Iterable[str], kernel: str) -> tuple[str, ...]:
    """The kernels of `agree_with` that compute what `kernel` computes (`Capabilities.computes`):
    only they can check it at full length (a softmax kernel cannot check a linear-attention one, nor
    GLA gated DeltaNet)."""
    computes = registry.get(kernel).caps.computes
    return tuple(name for name in agree_with if registry.get(name).caps.computes == computes)


def _check_for(check: dict[str, Any], dtype: str, beyond: bool, backward: bool, agree_with: tuple[str, ...]) -> str:
    """The `check` JSON of a cell: a dtype with a late default tolerance gets it (see LATE_TOLERANCES);
    `agree_with` (the cell's `comparators`) stays only in cells longer than the check length
    (`beyond`), where it applies, and only where one is listed, so asking for full-length agreement,
    or listing comparators of another function, changes no other cell's digest. Those with a
    backward pass also carry `agree_gradients` (their agreement compares dQ, dK and dV too:
    longca.run.agreement), which set them apart from the rows measured before it did."""
    check = dict(check)
    if dtype in LATE_TOLERANCES:
        check["tolerance"] = {dtype: LATE_TOLERANCES[dtype], **check.get("tolerance", {})}
    check.pop("agree_with", None)
    if beyond and agree_with:
        check["agree_with"] = list(agree_with)
        if backward:
            check["agree_gradients"] = True
    return json.dumps(check, sort_keys=True)


def expand(spec: Spec) -> list[Cell]:
    """Every cell of the spec, in a stable order: cheap (short) cells first within each sweep, then
    problem by problem with the kernels of one problem together."""
    cells: list[Cell] = []
    agree_with = tuple(spec.check.get("agree_with", ()))
    agree = {k: comparators(agree_with, k) if agree_with else () for sw in spec.sweeps for k in sw.kernels}
    checks = {
        (dtype, beyond, backward, kernel): _check_for(spec.check, dtype, beyond, backward, agree[kernel])
        for sw in spec.sweeps
        for dtype in sw.dtypes
        for kernel in sw.kernels
        for beyond in (False, True)
        for backward in (False, True)
    }
    for sw in spec.sweeps:
        repeat = tuple(sorted(sw.repeat.items()))
        cp_variants: list[tuple[int, str | None, tuple, str | None, str | None]] = [(1, None, (), None, None)]
        if sw.cp:
            cp_variants = [
                (w, mech, degrees, sw.cp.get("balance", "auto"), sw.cp.get("backend", "auto"))
                for mech in sw.cp["mechanisms"]
                for w in sw.cp["world_sizes"]
                for degrees in cp_layouts(mech, w, sw.cp)
            ]
        # problem by problem (length, mask, shape, pass), every kernel of a problem in a row: they
        # share its masks, references and full-length comparator results (longca.run.agreement)
        for seqlen, mask, (hq, hkv), d, dtype, b, p, kernel, cpv in itertools.product(
            sorted(sw.seqlens),
            sw.masks,
            sw.heads,
            sw.head_dims,
            sw.dtypes,
            sw.batch,
            sw.passes,
            sw.kernels,
            cp_variants,
        ):
            world, mech, degrees, balance, backend = cpv
            values = {
                "kernel": kernel,
                "mask": mask.name,
                "seqlen": seqlen,
                "heads": f"{hq}:{hkv}",
                "head_dim": d,
                "dtype": dtype,
                "pass": p,
                "batch": b,
                "cp_mechanism": mech,
                "world_size": world,
            }
            if excluded(sw, values):
                continue
            cells.append(
                Cell(
                    spec=spec.name,
                    sweep=sw.name,
                    kernel=kernel,
                    mask=mask.name,
                    mask_params=mask.params,
                    seqlen=seqlen,
                    heads_q=hq,
                    heads_kv=hkv,
                    head_dim=d,
                    dtype=dtype,
                    pass_=p,
                    batch=b,
                    device=spec.device,
                    seed=spec.seed,
                    samples=_samples(sw, mask),
                    repeat=repeat,
                    check=checks[dtype, seqlen > int(spec.check["max_seqlen"]), p != Pass.FWD, kernel],
                    timeout_s=sw.timeout_s,
                    world_size=world,
                    cp_mechanism=mech,
                    cp_degrees=degrees,
                    cp_balance=resolve_balance(balance, mask.name, degrees) if mech else None,
                    cp_backend=resolve_backend(backend, spec.device) if mech else None,
                )
            )
    ids = [c.relpath() for c in cells]
    if len(set(ids)) != len(ids):
        raise ValueError("two cells map to one path: duplicate axis values in the spec")
    return cells

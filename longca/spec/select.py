"""Selecting cells of a spec by sweep and by value (`--sweep`, `--only KEY=VALUE` of `longca run`
and `longca plan`); a selection that matches no cell is a typo, named with the allowed values."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from longca.spec.cells import Cell, unknown_sweep
from longca.vocab import AXES, AXIS_ALIASES, axis_name, normalise

ONLY_HELP = (
    "only cells with this value (repeatable; repeated keys are alternatives), keys: "
    + ", ".join(AXES)
    + " (seqlen_q is seqlen; lengths as 32K, dtypes as bf16 are accepted)"
)


def check_selection(spec_name: str, cells: list, sweeps: Iterable[str] | None, only: list[str]) -> None:
    """A --sweep or --only value that matches no cell of the spec (`cells`: all of them) is a typo:
    say so before any run instead of silently running nothing."""
    names = {c.sweep for c in cells}
    for name in sweeps or []:
        if error := unknown_sweep(name, spec_name, names):
            raise ValueError(error)
    if sweeps:
        cells = [c for c in cells if c.sweep in sweeps]
    for key, values in _wanted(only).items():
        present = {_value_of(c, key) for c in cells}
        for v in sorted(values - present):
            raise ValueError(
                f"--only {key}={v}: no cell of the selected sweeps has it; allowed: "
                f"{', '.join(sorted(present, key=_natural))}"
            )


def _natural(s: str):
    return (len(s), s) if s.isdigit() else (0, s)


def _wanted(only: list[str]) -> dict[str, set[str]]:
    wanted: dict[str, set[str]] = {}
    for item in only:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--only {item!r}: expected KEY=VALUE")
        if AXIS_ALIASES.get(key, key) not in AXES:
            raise ValueError(
                f"--only: unknown key {key!r}; allowed: {', '.join(AXES)} "
                f"(or a row column name: {', '.join(k for k in AXIS_ALIASES if '_' in k)})"
            )
        name = axis_name(key)
        try:
            wanted.setdefault(name, set()).add(normalise(name, value))
        except ValueError as exc:
            raise ValueError(f"--only {item}: {exc}") from None
    return wanted


def _value_of(cell: Cell, key: str) -> str:
    return str(cell.axis_value(key))


def selector(only: list[str], sweeps: Iterable[str] | None = None) -> Callable[[object], bool]:
    """A predicate: is a cell in one of `sweeps` (any, when none are given) with one of the wanted
    values for every --only key?"""
    wanted, chosen = _wanted(only), set(sweeps or ())
    return lambda cell: (
        (not chosen or cell.sweep in chosen) and all(_value_of(cell, k) in vals for k, vals in wanted.items())
    )

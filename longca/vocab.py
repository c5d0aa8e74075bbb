"""The project's words, at the ground floor: closed sets as enums, FLOP factors, axis names and
the one normaliser of axis values. Imports nothing of longca and not torch (the Snakefile and
`longca validate` read it without loading a kernel).

Enums are `StrEnum`s: a member equals its string (`Pass.FWD == "fwd"`), so rows, paths, digests
and specs keep plain strings while the code names each value once.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any


class Pass(StrEnum):
    FWD = "fwd"
    BWD = "bwd"
    FWD_BWD = "fwd_bwd"


# FLOPs of a pass relative to the forward (measurement conventions): the backward is 2 for the
# gradients + 0.5 for recomputation; forward+backward 3.5.
PASS_FLOP_FACTOR: dict[str, float] = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}


class Status(StrEnum):
    OK = "ok"
    UNSUPPORTED = "unsupported"
    OOM = "oom"
    ERROR = "error"
    TIMEOUT = "timeout"
    INCORRECT = "incorrect"


class Time(StrEnum):
    """Which time a report's throughput is at: the kernel's (the cell's pass replayed from a CUDA
    graph, no host launch time, where it was captured; eager elsewhere) or the eager call's."""

    KERNEL = "kernel"
    EAGER = "eager"


class Verdict(StrEnum):
    """What `longca compare` says of one cell (longca.report.compare)."""

    FASTER = "faster"
    SLOWER = "slower"
    SAME = "same"
    NOISY = "noisy"
    STATUS_CHANGED = "status changed"
    ONLY_IN_BASE = "only in base"
    ONLY_IN_NEW = "only in new"


class Layout(StrEnum):
    BSHD = "bshd"  # (batch, seqlen, heads, head_dim), flash-attn style
    BHSD = "bhsd"  # (batch, heads, seqlen, head_dim), SDPA / FlexAttention style
    THD = "thd"  # (total_tokens, heads, head_dim), varlen: documents packed


class Dtype(StrEnum):
    FLOAT64 = "float64"
    FLOAT32 = "float32"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT8_E4M3FN = "float8_e4m3fn"


DTYPE_ALIASES: dict[str, str] = {
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
}
# fp8 tensor cores exist from Ada/Hopper (sm89) on: a hardware fact, whatever a kernel declares.
DTYPE_MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {"float8_e4m3fn": (8, 9)}


def torch_dtype(name: str):
    """The torch dtype of a `Dtype` name (torch is imported here, only when asked)."""
    import torch

    return getattr(torch, Dtype(name).value)


class Mechanism(StrEnum):
    """The five context-parallel mechanisms (longca.cp.mechanisms says how each runs)."""

    ULYSSES = "ulysses"
    RING_P2P = "ring_p2p"
    RING_ALLGATHER = "ring_allgather"
    USP = "usp"
    LOONGTRAIN = "loongtrain"


class Balance(StrEnum):
    AUTO = "auto"  # chosen per mask (longca.spec.cells.resolve_balance)
    CONTIGUOUS = "contiguous"
    ZIGZAG = "zigzag"
    DOCUMENT = "document"


# dtypes the context-parallel mechanisms carry (fp8 has no backward and no LSE combination here)
CP_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})

# The axes a cell is selected by (`--only`, `exclude`): one name each, the row column's aliases
# accepted. Values are compared after `normalise`.
AXES = (
    "kernel",
    "mask",
    "mask_variant",  # the mask's parameters as one name (block-128_density-0.5, window-1024, default)
    "seqlen",
    "heads",
    "head_dim",
    "dtype",
    "pass",
    "batch",
    "cp_mechanism",
    "world_size",
    "cp_variant",  # the CP degrees and sharding as one name (ulysses2-ring2-zigzag, zigzag, default)
)
AXIS_ALIASES: dict[str, str] = {
    "kernels": "kernel",
    "masks": "mask",
    "seqlens": "seqlen",
    "seqlen_q": "seqlen",
    "seqlen_k": "seqlen",
    "head_dims": "head_dim",
    "dtypes": "dtype",
    "passes": "pass",
    "pass_": "pass",
    "variant": "mask_variant",
    "mechanism": "cp_mechanism",
    "mechanisms": "cp_mechanism",
    "world_sizes": "world_size",
    "cp_variants": "cp_variant",
}


def axis_name(key: str) -> str:
    """The canonical axis name of `key` (a name or an alias); ValueError naming the allowed ones."""
    name = AXIS_ALIASES.get(key, key)
    if name not in AXES:
        raise ValueError(f"unknown axis {key!r}; allowed: {', '.join(AXES)} (aliases: {', '.join(AXIS_ALIASES)})")
    return name


# The longest sequence a spec may ask for: 16M tokens (one bf16 q of 64 heads x 128 is then 256 GiB;
# 512K is the longest any published spec measures). A cell longer than its device can hold is an
# `oom` row (longca.run.cell), a length past this a spec error.
MAX_SEQLEN = 16 * 1024 * 1024
SEQLEN_ALLOWED = "allowed: a number of tokens, or a number with K or M (32K, 1M), from 1 up to 16M"


def parse_seqlen(value: Any) -> int:
    """1024, "1K", "512K", "1M" -> tokens; ValueError for anything else, a length below 1 or one
    past MAX_SEQLEN."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a length; {SEQLEN_ALLOWED}")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"([0-9]+)([KkMm]?)", str(value).strip())
        if not m:
            raise ValueError(f"{value!r} is not a length; {SEQLEN_ALLOWED}")
        n = int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]
    if not 1 <= n <= MAX_SEQLEN:
        raise ValueError(f"{value!r} ({n} tokens) is out of range; {SEQLEN_ALLOWED}")
    return n


def normalise(key: str, value: Any) -> str:
    """The comparable text of an axis value: lengths in tokens ("32K" -> "32768"), dtype aliases
    resolved ("bf16" -> "bfloat16"), everything else as written. `key` may be an alias."""
    name = axis_name(key)
    if name == "seqlen":
        return str(parse_seqlen(value))
    if name == "dtype":
        return str(DTYPE_ALIASES.get(str(value), str(value)))
    return str(value)

"""flash-linear-attention (``fla``, PyPI ``fla-core``): linear-attention kernels in Triton.

Four chunked kernels, one per family (see longca.kernels.linear.families for what each computes):

- ``fla_linear_attn``     fla.ops.linear_attn.chunk_linear_attn (normalize=False)
- ``fla_simple_gla``      fla.ops.simple_gla.chunk_simple_gla (gate per head)
- ``fla_gla``             fla.ops.gla.chunk_gla (gate per key dim)
- ``fla_gated_deltanet``  fla.ops.gated_delta_rule.chunk_gated_delta_rule (use_qk_l2norm_in_kernel=True)

These are the chunked forms (chunk 64), forward and backward (fla's own autograd Functions). Each
family also has its recurrent form, ``fla_<family>_recurrent`` (fla's ``fused_recurrent_*``: one
step per token, the state in registers; written apart from the chunked kernels, so it can check
them at full length, where no float64 reference fits: ``check.agree_with``). The recurrent gated
delta rule has no backward in fla ("not implemented"), so its capabilities declare none.
Capabilities are per kernel: ``computes`` names the family, so only kernels of one family check
each other.
Masks: ``causal`` (form "causal": fla's batch dim) and ``causal_document`` (form "varlen": the
batch's documents are packed into one sequence, a free view of the contiguous (B, S, H, D) input,
and handed to fla as ``cu_seqlens``; the state restarts at each document). Layout is "bshd" for
both; the varlen call also accepts "thd" (B*S, H, D) tensors and returns the layout it was given.
No other mask has a meaning here: a linear attention kernel has no score matrix to mask, so every
other cell is ``unsupported``.

Linear attention with ``normalize=False``: fla's default divides by q.(sum of k), which with raw
N(0, 1) inputs (no positive feature map) divides by numbers near zero; the kernel measured is the
unnormalised product, which is also what simple GLA and GLA compute with the gate at zero.

GQA: fla's kernels take as many k/v heads as q heads, so k and v are repeated to heads_q inside
the timed call (``repeat_interleave`` on the head dim; its cost is part of the measured time and
its backward sums the gradients per group). The reference repeats them the same way.

Extra inputs (gates, beta) are made in ``prepare`` (longca.kernels.linear.families.make_extra)
and kept in ``Prepared.extra["inputs"]``; ``Prepared.extra`` also carries:
- ``reference``: (q, k, v) in the prepared layout -> float64 output (chunked float64 form,
  tested against the exact recurrence), differentiable for the gradient check;
- ``flop_model`` and ``flops`` ({"fwd", "bwd", "fwd_bwd"} -> FLOPs, see
  longca.kernels.linear.flops); ``kernel_family`` is "linear";
- ``tolerance``: suggested relative error bounds per dtype against the float64 reference.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from longca.kernels.base import Capabilities, Prepared, Unsupported
from longca.kernels.linear.families import FAMILIES, LinearFamily, make_extra
from longca.kernels.linear.flops import CHUNK, linear_flops
from longca.kernels.registry import register
from longca.masks.forms import varlen_form
from longca.masks.mask import Mask

PACKAGE = "fla"
MASKS = frozenset({"causal", "causal_document"})
FORM_OF_MASK = {"causal": "causal", "causal_document": "varlen"}
# Suggested bounds on ||out - ref|| / ||ref|| (and gradients) against the float64 reference.
TOLERANCE = {"float32": 5e-3, "float16": 2e-2, "bfloat16": 3e-2}

CAPS = Capabilities(
    mask_forms=frozenset(FORM_OF_MASK.values()),
    dtypes=frozenset({"bfloat16", "float16", "float32"}),
    devices=frozenset({"cuda"}),  # Triton GPU kernels; they do not run under TRITON_INTERPRET=1 (docs/linear.md)
    head_dims=frozenset({64, 128, 256}),  # fla's chunk kernels take K, V <= 256
    gqa=True,
    backward=True,
    package=PACKAGE,
    family="linear",
    masks=MASKS,
)  # each kernel's own: this with `computes` (its family) and `backward` (its op's)


@dataclass(frozen=True)
class FlaOp:
    module: str
    function: str
    flop_model: str  # a key of longca.kernels.linear.flops.MODELS: the algorithm's work
    fixed: dict[str, Any] = field(default_factory=dict)  # constant keyword arguments
    extra_args: dict[str, str] = field(default_factory=dict)  # fla argument name -> key of the extra inputs
    takes_cu_seqlens_cpu: bool = True
    # The backward goes through fla.ops.common.chunk_o.chunk_bwd_dqkwg with a gate, which fla
    # refuses on Hopper with Triton >= 3.4, < 3.7.1 (wrong gradients there: fla issue #640).
    gated_dqkwg: bool = False
    backward: bool = True  # fla's fused_recurrent_gated_delta_rule raises NotImplementedError in backward

    def load(self) -> Callable[..., Any]:
        """The fla function, imported on first use (fla is optional; importing it costs ~1 s)."""
        return getattr(importlib.import_module(self.module), self.function)


# The chunked kernels, by family.
OPS: dict[str, FlaOp] = {
    "linear_attn": FlaOp(
        "fla.ops.linear_attn",
        "chunk_linear_attn",
        "linear_attn_chunk_v1",
        {"normalize": False},
        takes_cu_seqlens_cpu=False,
    ),
    "simple_gla": FlaOp(
        "fla.ops.simple_gla", "chunk_simple_gla", "linear_simple_gla_chunk_v1", {}, {"g": "g"}, gated_dqkwg=True
    ),
    "gla": FlaOp("fla.ops.gla", "chunk_gla", "linear_gla_chunk_v1", {}, {"g": "gk"}),
    "gated_deltanet": FlaOp(
        "fla.ops.gated_delta_rule",
        "chunk_gated_delta_rule",
        "linear_gated_deltanet_chunk_v1",
        {"use_qk_l2norm_in_kernel": True},
        {"g": "g", "beta": "beta"},
        gated_dqkwg=True,
    ),
}
# The recurrent kernels, by family: independent of the chunked ones (fla.ops.common.fused_recurrent
# and the delta rule's own), so they serve as their full-length comparators. None takes cu_seqlens_cpu.
RECURRENT_OPS: dict[str, FlaOp] = {
    "linear_attn": FlaOp(
        "fla.ops.linear_attn",
        "fused_recurrent_linear_attn",
        "linear_recurrent_v1",
        {"normalize": False},
        takes_cu_seqlens_cpu=False,
    ),
    "simple_gla": FlaOp(
        "fla.ops.simple_gla", "fused_recurrent_simple_gla", "linear_recurrent_v1", {}, {"g": "g"}, False
    ),
    "gla": FlaOp("fla.ops.gla", "fused_recurrent_gla", "linear_recurrent_v1", {}, {"gk": "gk"}, False),
    "gated_deltanet": FlaOp(
        "fla.ops.gated_delta_rule",
        "fused_recurrent_gated_delta_rule",
        "linear_delta_recurrent_v1",
        {"use_qk_l2norm_in_kernel": True},
        {"g": "g", "beta": "beta"},
        takes_cu_seqlens_cpu=False,
        backward=False,
    ),
}


def fla_kwargs(
    op: FlaOp,
    inputs: dict[str, torch.Tensor],
    *,
    scale: float,
    cu_seqlens: torch.Tensor | None,
    cu_seqlens_cpu: torch.Tensor | None,
) -> dict[str, Any]:
    """Keyword arguments of the fla call besides q, k, v."""
    kw: dict[str, Any] = {"scale": scale, **op.fixed}
    kw.update({arg: inputs[key] for arg, key in op.extra_args.items()})
    if cu_seqlens is not None:
        kw["cu_seqlens"] = cu_seqlens
        if op.takes_cu_seqlens_cpu:
            kw["cu_seqlens_cpu"] = cu_seqlens_cpu
    return kw


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(..., Hkv, D) -> (..., Hkv * groups, D): query head h reads key/value head h // groups."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=-2)


def packed_cu_seqlens(mask: Mask, batch: int) -> torch.Tensor:
    """Document offsets of the batch packed into one sequence: the mask's documents, batch times."""
    form = varlen_form(mask)
    if not form.causal:
        raise ValueError(f"mask {mask.name!r} is not causal: linear attention needs causal documents")
    docs = torch.as_tensor(form.cu_seqlens, dtype=torch.long).diff()
    return torch.cat([torch.zeros(1, dtype=torch.long), docs.repeat(batch).cumsum(0)])


class FlaLinearKernel:
    """One fla kernel (chunked or recurrent) of one linear-attention family."""

    layout = "bshd"  # for both forms; call also takes "thd" (B*S, H, D) tensors and answers in kind

    def __init__(self, family: LinearFamily, op: FlaOp, name: str, caps: Capabilities = CAPS) -> None:
        self.family = family
        self.op = op
        self.name = name
        self.caps = dataclasses.replace(caps, computes=family.name, backward=caps.backward and op.backward)
        self.description = f"flash-linear-attention {op.function}: {family.description}"

    def backward_refusal(self, device: torch.device) -> str | None:
        """fla's own refusal of this kernel's backward on `device` (see FlaOp.gated_dqkwg)."""
        if not self.op.gated_dqkwg or torch.device(device).type != "cuda":
            return None
        return gated_backward_refusal(dqkwg_guard_flags(), torch.cuda.get_device_capability(device))

    def prepare(
        self,
        mask: Mask,
        *,
        batch: int,
        heads_q: int,
        heads_kv: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        form: str,
    ) -> Prepared:
        t0 = time.perf_counter()
        if mask.name not in MASKS or FORM_OF_MASK[mask.name] != form:
            raise Unsupported(
                f"{self.name}: mask {mask.name!r} with form {form!r} unsupported; "
                f"allowed: {sorted(FORM_OF_MASK.items())}"
            )
        if heads_q % heads_kv:
            raise Unsupported(f"{self.name}: heads_q={heads_q} is not a multiple of heads_kv={heads_kv}")
        groups = heads_q // heads_kv
        seqlen = mask.seqlen_q
        device = torch.device(device)
        if form == "varlen":
            cu_cpu = packed_cu_seqlens(mask, batch)
            cu = cu_cpu.to(device)
            extra_batch, tokens = 1, batch * seqlen
        else:
            cu_cpu, cu = None, None
            extra_batch, tokens = batch, seqlen
        inputs = make_extra(
            self.family,
            batch=extra_batch,
            tokens=tokens,
            heads=heads_q,
            head_dim=head_dim,
            device=device,
            beta_dtype=dtype,
        )
        scale = head_dim**-0.5
        op = self.op
        kwargs = fla_kwargs(self.op, inputs, scale=scale, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
        packed = cu is not None
        family = self.family

        def pack(x: torch.Tensor) -> torch.Tensor:
            # (B, S, H, D) or (B*S, H, D) -> (1, B*S, H, D): the batch's documents in one sequence (a view)
            return x.reshape(1, -1, x.shape[-2], x.shape[-1])

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            shape = q.shape
            if packed:
                q, k, v = pack(q), pack(k), pack(v)
            o, _ = op.load()(q, repeat_kv(k, groups), repeat_kv(v, groups), **kwargs)
            return o.reshape(*shape[:-1], o.shape[-1])

        def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            shape = q.shape
            if packed:
                q, k, v = pack(q), pack(k), pack(v)
            o = family.reference_chunk(q, repeat_kv(k, groups), repeat_kv(v, groups), inputs, cu_cpu)
            return o.reshape(*shape[:-1], o.shape[-1])

        total = batch * seqlen
        passes = ("fwd", "bwd", "fwd_bwd") if op.backward else ("fwd",)
        flops = {
            p: linear_flops(op.flop_model, tokens=total, heads_q=heads_q, head_dim=head_dim, pass_=p) for p in passes
        }
        version = _version()
        return Prepared(
            call=call,
            layout=self.layout,
            build_s=time.perf_counter() - t0,
            info={
                "backend": f"fla {version} {op.function}"
                + (f" chunk={CHUNK}" if op.function.startswith("chunk") else "")
            },
            extra={
                "kernel_family": "linear",
                "family": family.name,
                "reference": reference,
                "flop_model": op.flop_model,
                "flops": flops,
                "inputs": inputs,
                "cu_seqlens": cu_cpu,
                "tolerance": TOLERANCE,
                "package_version": version,
            },
        )


@functools.cache
def dqkwg_guard_flags() -> dict[str, Any]:
    """The flags fla's chunk_bwd_dqkwg guard reads, from fla itself, and the Triton version (fixed
    for the process: read once, not at every backward cell)."""
    import triton
    from fla.ops.common import chunk_o

    return {
        "triton": triton.__version__,
        "fla": _version(),
        "tilelang": importlib.util.find_spec("tilelang") is not None,
        **{
            name: bool(getattr(chunk_o, name, False))
            for name in ("IS_NVIDIA_HOPPER", "TRITON_ABOVE_3_4_0", "TRITON_ABOVE_3_7_1")
        },
    }


def gated_backward_refusal(flags: dict[str, Any], compute_capability: tuple[int, int]) -> str | None:
    """Why fla will not run a gated chunk_bwd_dqkwg here, or None.

    fla raises at the first backward on Hopper (sm90) with Triton >= 3.4.0 and < 3.7.1 unless its
    tilelang backend is installed: Triton there computes wrong gradients (fla issue #640)."""
    refused = (
        flags["IS_NVIDIA_HOPPER"]
        and compute_capability[0] == 9
        and flags["TRITON_ABOVE_3_4_0"]
        and not flags["TRITON_ABOVE_3_7_1"]
        and not flags["tilelang"]
    )
    if not refused:
        return None
    return (
        f"fla {flags['fla']} refuses the gated backward (chunk_bwd_dqkwg) on Hopper with Triton "
        f"{flags['triton']}: Triton >= 3.4.0, < 3.7.1 computes wrong gradients there (fla issue #640); "
        "needs Triton >= 3.7.1 or tilelang"
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("fla-core", "flash-linear-attention"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "unknown"


for _name, _op in OPS.items():
    register(FlaLinearKernel(FAMILIES[_name], _op, f"fla_{_name}"))
for _name, _op in RECURRENT_OPS.items():
    register(FlaLinearKernel(FAMILIES[_name], _op, f"fla_{_name}_recurrent"))

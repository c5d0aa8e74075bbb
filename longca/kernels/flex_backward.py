"""FlexAttention's backward kernel on a given output and LSE, without running the forward again.

A ring step's gradient is its additive share of the combined attention's gradient when its
backward reads the COMBINED output O and LSE L (P = exp(S scale - L), D = rowsum(dO * O)): what
flash-attn's `_flash_attn_backward` and the SDPA backward ops take as arguments. FlexAttention's
public API has no such entry; its backward is reached through autograd of a forward call, so
`longca.kernels.rank.bwd_by_autograd` had to run each step's forward again inside the backward (the
CP Flex backward kept 54-69% of single-GPU Flex on two H200s).

Here torch's backward operator (`torch.ops.higher_order.flex_attention_backward`, the node an
ordinary compiled Flex backward graph holds) is called directly with (q, k, v, O, L, dO):
  - on CUDA, a graph holding that one node is traced once per shape and mask structure
    (`make_fx`, fake tensors) and compiled by Inductor into the same Triton backward template
    Flex uses; cached per process;
  - elsewhere it runs eagerly (torch's reference implementation: dense S x S scores, small
    problems only), which is what lets CPU tests check the CP Flex backward at all.

Shapes: q (B, Hq, Sq, D), k/v (B, Hkv, Sk, D) with Hq a multiple of Hkv (GQA inside the kernel),
out and dout (B, Hq, Sq, Dv), lse (B, Hq, Sq) in natural log, -inf on rows with no key. Returns
(dq, dk, dv) in q's dtype. The BlockMask's mask_mod must read no captured tensor, or carry them as
`mask_mod.buffers` with `mask_mod.with_buffers` (longca.masks.flex's mask_mods do).

Relies on torch internals (the operator, `create_fw_bw_graph`, `_apply_kernel_options`) whose
shapes have changed between releases: checked on CPU here; on CUDA every CP cell is checked
against the float64/float32 reference before it is timed.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch

LN2 = math.log(2.0)
_compiled: dict[tuple, Callable] = {}


def _mask_fn_and_buffers(mask_mod: Callable) -> tuple[Callable, tuple[torch.Tensor, ...]]:
    """The mask function with every tensor it reads as an argument, and those tensors."""
    if hasattr(mask_mod, "with_buffers"):
        return mask_mod.with_buffers, tuple(mask_mod.buffers)
    cells = [c.cell_contents for c in (getattr(mask_mod, "__closure__", None) or ())]
    if any(
        isinstance(x, torch.Tensor) or (isinstance(x, (list, tuple)) and any(isinstance(y, torch.Tensor) for y in x))
        for x in cells
    ):
        raise ValueError(
            "flex_backward: the BlockMask's mask_mod captures tensors; give it `buffers` and "
            "`with_buffers` (see longca.masks.flex._explicit)"
        )
    return mask_mod, ()


def _kernel_options(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> dict[str, Any]:
    """The options flex_attention itself would pass for a call returning the LSE (this torch's
    defaults, whatever keys it has)."""
    from torch.nn.attention import flex_attention as fa

    kwargs: dict[str, Any] = {"return_aux": fa.AuxRequest(lse=True)} if _takes_return_aux() else {}
    return dict(fa._apply_kernel_options(q, k, v, True, None, **kwargs))


@functools.cache
def _takes_return_aux() -> bool:
    """Whether this torch's `_apply_kernel_options` has the `return_aux` argument (newer releases)."""
    from torch.nn.attention import flex_attention as fa

    return "return_aux" in inspect.signature(fa._apply_kernel_options).parameters


def _lse_is_log2(options: dict[str, Any]) -> bool:
    # flex_attention returns LSE * ln2 from the operator unless the FLASH (CuTe) backend ran it.
    return options.get("BACKEND", "AUTO") != "FLASH"


def _graphs(q: torch.Tensor):
    from torch._higher_order_ops.flex_attention import create_fw_bw_graph
    from torch.nn.attention.flex_attention import _identity

    ex = (q.new_zeros((), requires_grad=True),) + tuple(q.new_zeros((), dtype=torch.int) for _ in range(4))
    return create_fw_bw_graph(_identity, ex, ())


def _backward_fn(block_tuple: tuple, mask_fn: Callable, scale: float, options: dict[str, Any], fw, joint):
    """f(q, k, v, out, lse2, dout, *mask_buffers, *block_tensors) -> (dq, dk, dv), block_tensors
    the BlockMask tuple's tensors in order (`_block_tensors`)."""
    from torch._higher_order_ops.flex_attention import flex_attention_backward

    tensor_at = [i for i, x in enumerate(block_tuple) if isinstance(x, torch.Tensor)]
    n_tensors = len(tensor_at)

    def f(q, k, v, out, lse2, dout, *rest):
        bufs, blocks = rest[: len(rest) - n_tensors], rest[len(rest) - n_tensors :]
        t = list(block_tuple[:-1]) + [mask_fn]
        for i, x in zip(tensor_at, blocks):
            t[i] = x
        dq, dk, dv, _ = flex_attention_backward(
            q, k, v, out, lse2, dout, None, fw, joint, tuple(t), scale, options, (), tuple(bufs)
        )
        return dq, dk, dv

    return f


def _block_tensors(block_tuple: tuple) -> tuple[torch.Tensor, ...]:
    return tuple(x for x in block_tuple if isinstance(x, torch.Tensor))


def _signature(block_tuple: tuple, args: tuple) -> tuple:
    """What a traced graph depends on besides tensor contents: every input's shape, stride, dtype and
    device, and the BlockMask's non-tensor entries (lengths, block sizes)."""
    meta = tuple((tuple(a.shape), tuple(a.stride()), a.dtype, a.device) for a in args)
    consts = tuple(
        "tensor"
        if isinstance(x, torch.Tensor)
        else x
        if isinstance(x, (int, float, bool, type(None)))
        else type(x).__name__
        for x in block_tuple[:-1]
    )  # which entries are tensors, too
    return meta + consts


def _closure_constants(fn: Callable) -> tuple:
    """The numbers a mask function's code reads from its closure (layer counts, GQA group, lengths):
    a traced graph holds them as constants."""
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    return (getattr(fn, "__code__", None),) + tuple(
        x for x in cells if isinstance(x, (int, float, bool, str, type(None)))
    )


def flex_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    block_mask,
    scale: float | None = None,
    compiled: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of attention under `block_mask` whose softmax statistics are (out, lse): with a
    ring step's K/V and the combined (out, lse), the step's exact share of the gradients.
    `compiled` defaults to True on CUDA (Inductor's Triton kernel) and False elsewhere (eager)."""
    if compiled is None:
        compiled = q.device.type == "cuda"
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    options = _kernel_options(q, k, v)
    mask_fn, bufs = _mask_fn_and_buffers(block_mask.mask_mod)
    block_tuple = block_mask.as_tuple()
    lse = lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32)
    lse2 = lse / LN2 if _lse_is_log2(options) else lse
    inputs = (
        q,
        k,
        v,
        out.to(q.dtype).contiguous(),
        lse2.contiguous(),
        dout.to(q.dtype).contiguous(),
        *bufs,
        *_block_tensors(block_tuple),
    )
    if not compiled:
        return _backward_fn(block_tuple, mask_fn, scale, options, *_graphs(q))(*inputs)
    key = (
        _signature(block_tuple, inputs),
        len(bufs),
        _closure_constants(mask_fn),
        scale,
        tuple(sorted(options.items())),
    )
    fn = _compiled.get(key)
    if fn is None:
        fn = _compiled[key] = _compile(_backward_fn(block_tuple, mask_fn, scale, options, *_graphs(q)), inputs)
    return fn(*inputs)


def trace(f: Callable, args: tuple) -> torch.fx.GraphModule:
    """The graph of f on fake copies of args: one flex_attention_backward node, its score, joint and
    mask functions as submodules, every tensor an input."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(f, tracing_mode="fake")(*args)


def _compile(f: Callable, args: tuple) -> Callable:
    import torch._inductor

    gm = trace(f, args)
    run = torch._inductor.compile(gm, list(args))

    def call(*xs):
        r = run(*xs)
        return tuple(r)[:3]

    return call

"""FlexAttention (torch.nn.attention.flex_attention), compiled once per process.

Shapes: q (B, Hq, S, D), k/v (B, Hkv, S, D) -> out (B, Hq, S, D); GQA through enable_gqa=True.
Every static mask and both block-sparse masks reach the kernel as a BlockMask built straight from
the mask's slices (or block layout) by longca.masks.flex.to_block_mask: full blocks skip the
mask_mod, partial blocks evaluate it from per-query key intervals, and no S x S tensor exists.

`compiled_flex()` wraps flex_attention in torch.compile(dynamic=False) once per process; the
mask_mod reads its intervals from tensors, so masks of one shape share one compiled kernel.
`prepare` builds the BlockMask (timed as build_s) and calls nothing: the first call at a shape
compiles, and the cell's first warm-up iteration measures that (compile_s). A warm-up of its own
here would cost two extra forward + backward calls per cell (minutes per 512K cell).

Block-sparse layouts with uniform blocks that 128 does not divide (block 64, 32, 16) get a BlockMask
at their own block size, with Triton tiles that divide it (`kernel_options`): on the 128 grid most
grid blocks of a 64-block layout are partial, so mask_mod ran per element (the H200 sparse sweep:
Flex block 64 at 116 TFLOP/s median forward against 414 at block 128, before this choice). The
backward cannot follow on sm90 at head dims 64-128: torch's Flex backward only considers configs whose
default tiles (64, 128, 128, 64) divide the block, so a cell with gradients gets the 128 grid, and a
forward-only cell its own block (`grad` in prepare, `grad_changes_form` for the check).

Limits: FlexAttention has no backward on CPU (the call raises Unsupported for inputs that need
grad, so such cells are `unsupported`), and on CPU takes float32/float16/bfloat16 only. fp8
(float8_e4m3fn) runs forward only, on CUDA: q, k, v and the output in e4m3, softmax statistics in
float32 inside the kernel. On sm90 the Triton templates' default tiles cover head dims up to
256; head dim 256 backward is the first to run out of shared memory if anything does (see
docs/kernels.md for what the H200 run showed).
"""

from __future__ import annotations

import math
import time

import torch

from longca.kernels.base import Capabilities, Prepared, RankCapabilities, Unsupported, sync
from longca.kernels.dynamo_limits import raise_recompile_limits
from longca.kernels.lse import Part
from longca.kernels.rank import NO_SLICES, RankKernel, SubMask, acc_dtype, check_heads, layout_area
from longca.kernels.registry import register
from longca.masks import slices as sl
from longca.masks.blocks import BlockLayout
from longca.masks.mask import Mask

BLOCK_SIZE = 128

_compiled = None
CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def compiled_flex():
    """torch.compile(flex_attention, dynamic=False), created on first use and reused."""
    global _compiled
    if _compiled is None:
        from torch.nn.attention.flex_attention import flex_attention

        raise_recompile_limits()
        # The CP bench and `repeat.backward: retained_graph` run several backwards on one saved
        # forward (retain_graph=True); compiled graphs with donated buffers refuse that (seen on the
        # H200, torch 2.11).
        import torch._functorch.config as functorch_config

        if hasattr(functorch_config, "donated_buffer"):
            functorch_config.donated_buffer = False
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def flex_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask, kernel_options: dict[str, int] | None = None
) -> torch.Tensor:
    """q (B, Hq, S, D), k/v (B, Hkv, S, D), BlockMask -> out (B, Hq, S, D)."""
    return compiled_flex()(
        q, k, v, block_mask=block_mask, enable_gqa=q.shape[1] != k.shape[1], kernel_options=kernel_options
    )


def block_size_for(
    mask: Mask,
    grad: bool = False,
    head_dim: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> int:
    """BlockMask block size: 128, or for a uniform block-sparse layout that 128 does not divide the
    largest of 64, 32, 16 that divides its block (every kept block is then a FULL BlockMask block).
    With `grad`, a block torch's Flex backward cannot run at (`backward_runs_at`) falls back to 128."""
    block = mask.blocks.uniform_block if mask.blocks is not None else None
    if not block or block % BLOCK_SIZE == 0:
        return BLOCK_SIZE
    own = next((b for b in (64, 32, 16) if block % b == 0), BLOCK_SIZE)
    if grad and own != BLOCK_SIZE and not backward_runs_at(own, head_dim, dtype, torch.device(device)):
        return BLOCK_SIZE
    return own


def backward_tile_configs(head_dim: int, dtype: torch.dtype) -> list[tuple[int, int, int, int]]:
    """(BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2) of every backward config Inductor considers on the
    current CUDA device, read from torch's own table (one default unless max_autotune is on)."""
    try:
        from torch._inductor.template_heuristics.triton import CUDAConfigHeuristic
    except ImportError:  # older layout of the same module
        from torch._inductor.template_heuristics import CUDAConfigHeuristic
    return [
        (c.block_m1, c.block_n1, c.block_m2, c.block_n2)
        for c in CUDAConfigHeuristic().get_flex_attn_bwd_configs(head_dim, dtype)
    ]


def backward_runs_at(block_size: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's compiled Flex backward has a config for a BlockMask of `block_size` on `device`.

    Inductor keeps a backward config only when its *default* tiles divide the BlockMask block, before
    any `bwd_BLOCK_*` kernel option applies (torch/_inductor/kernel/flex/flex_attention.py); on sm90 at
    head dims 64-128 the one default is (64, 128, 128, 64), so a 64-block BlockMask has none and the
    compile fails with NoValidChoicesError (seen on the H200 in the sparse_long sweep). On CPU Flex has no
    backward at all (the adapter refuses it separately), so any block passes here. If torch's table
    cannot be read, only 128 is trusted.
    """
    if device.type != "cuda":
        return True
    try:
        configs = backward_tile_configs(head_dim, dtype)
    except Exception:  # noqa: BLE001 - an unreadable table: the 128 grid is the form known to run
        return block_size % BLOCK_SIZE == 0
    return any(block_size % math.lcm(*tiles) == 0 for tiles in configs)


def kernel_options_for(block_size: int) -> dict[str, int] | None:
    """Forward Triton tiles that divide a BlockMask block smaller than 128 (torch refuses tiles that
    do not: "Q and KV block size must be divisible by BLOCK_M and BLOCK_N"); None keeps torch's
    defaults. The backward keeps its defaults: Inductor picks only configs whose default tiles divide
    the block (`backward_runs_at`), and `block_size_for` gives a backward no other block."""
    if block_size >= BLOCK_SIZE:
        return None
    return {"fwd_BLOCK_M": block_size, "fwd_BLOCK_N": block_size}


# ------------------------------------------------------------------ its per-rank form (context parallelism)
class RankFlex(RankKernel):
    """FlexAttention with a BlockMask built from the sub-mask's slices (compiled on CUDA).
    Rows of a step with no key get lse = -inf and zero output from FlexAttention itself."""

    name = "flex"
    takes_blocks = True

    def __init__(self) -> None:
        self._fn = None

    def _flex(self, device: torch.device):
        # On CUDA the single-device adapter's compiled flex_attention, whose raised recompile limits
        # matter here: every ring step's BlockMask and the check length recompile, and past dynamo's
        # default limit (8) it falls back to eager flex, which materialises S x S scores (the H200's
        # CP backward asked for 256 GiB that way).
        if self._fn is None:
            if device.type == "cuda":
                self._fn = compiled_flex()
            else:
                from torch.nn.attention.flex_attention import flex_attention

                self._fn = flex_attention
        return self._fn

    def prepare(self, slices, seqlen_q, seqlen_k, device):
        # The masks package builds the BlockMask block by block from the slices (never S x S).
        from longca.masks.flex import to_block_mask
        from longca.masks.mask import Mask

        area = sl.area(slices)
        bm = None
        if area:
            bm = to_block_mask(Mask("cp_step", seqlen_q, seqlen_k, slices), device=device)
        return SubMask(slices, seqlen_q, seqlen_k, area, bm)

    def prepare_blocks(self, layout: BlockLayout, heads_q: int, device: torch.device) -> SubMask:
        """BlockMask of the step's block layout, one entry per local query head (FlexAttention
        indexes a BlockMask by query head; GQA maps query head h to KV head h // group)."""
        from longca.masks.flex import to_block_mask
        from longca.masks.mask import Mask

        sq, sk = int(layout.q_bounds[-1]), int(layout.k_bounds[-1])
        area = layout_area(layout)
        bm = None
        if area:
            bm = to_block_mask(Mask("cp_step", sq, sk, NO_SLICES, blocks=layout), device=device, heads_q=heads_q)
        return SubMask(NO_SLICES, sq, sk, area, bm, layout)

    def _call(self, q, k, v, sub):
        from torch.nn.attention.flex_attention import AuxRequest

        out, aux = self._flex(q.device)(
            q,
            k,
            v,
            block_mask=sub.form,
            scale=1.0 / math.sqrt(q.shape[-1]),
            enable_gqa=q.shape[1] != k.shape[1],
            return_aux=AuxRequest(lse=True),
        )
        return out, aux.lse

    def fwd_parts(self, q, k, v, sub) -> list:
        """All rows as one part, out in the inputs' dtype (no float32 copy before the combination)."""
        check_heads(sub, k)
        # Never differentiated through (the ring's backward is hand-written); detached inputs also
        # keep torch from refusing CPU inputs that require grad.
        out, lse = self._call(q.detach(), k.detach(), v.detach(), sub)
        return [Part(out, lse.to(acc_dtype(q.dtype)), 0, q.shape[2])]

    def fwd(self, q, k, v, sub):
        ((out, lse, _, _),) = self.fwd_parts(q, k, v, sub)
        return out.to(acc_dtype(q.dtype)), lse

    def bwd(self, dout, q, k, v, out, lse, sub):
        """Flex's backward kernel given the combined (out, lse): no forward runs again
        (longca.kernels.flex_backward). The earlier path, `bwd_by_autograd` over `_call`, runs the
        step's forward again; benchmarks/cp_rank_local.py --also-autograd times it beside this one."""
        from longca.kernels.flex_backward import flex_backward

        check_heads(sub, k)
        a = acc_dtype(q.dtype)
        dq, dk, dv = flex_backward(dout, q, k, v, out, lse, sub.form, 1.0 / math.sqrt(q.shape[-1]))
        return dq.to(a), dk.to(a), dv.to(a)


class FlexAttention:
    name = "flex"
    layout = "bhsd"
    description = (
        "FlexAttention (torch.compile'd flex_attention) with a BlockMask built from the mask's "
        "slices, block size 128 (a uniform block-sparse layout's own block when 128 does not divide it)"
    )
    caps = Capabilities(
        mask_forms=frozenset({"blockmask"}),
        # fp8 (e4m3, forward only, CUDA only): Flex's Triton template takes fp8 q, k, v and returns
        # fp8; on the H200 (torch 2.11) it ran at 1.3-2.8x its bf16 rate, while the backward's
        # Inductor kernel failed to compile ('llvm.fmul' on i8) at head dims 64-256
        dtypes=frozenset({"float32", "float16", "bfloat16", "float8_e4m3fn"}),
        devices=frozenset({"cpu", "cuda"}),
        head_dims=None,
        gqa=True,
        backward=True,  # CUDA only: on CPU the call raises Unsupported for inputs that need grad
        backward_dtypes=frozenset({"float32", "float16", "bfloat16"}),
        # benchmarks/flex_retained_graph.py on the H200 (torch 2.11): 3 backwards on one retained
        # graph give gradients bitwise equal to a fresh forward + backward's (4 masks, 4K). An early
        # runner saw errors with it (9bbde11; their text was not kept, so the cause is unknown).
        # A cell where it fails is an `error` row, never a number.
        retained_backward=True,
        cp=RankCapabilities(
            devices=frozenset({"cpu", "cuda"}),
            dtypes=frozenset({"float64", "float32", "bfloat16", "float16"}),
            block_sparse=RankFlex.takes_blocks,
            note="backward: Flex's backward kernel on the combined out/LSE (eager off CUDA)",
        ),
    )

    def rank_kernel(self) -> RankFlex:
        return RankFlex()

    def grad_changes_form(self, mask: Mask, *, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
        """Whether a forward-only call gets another BlockMask than one with gradients (see base.py)."""
        device = torch.device(device)
        return block_size_for(mask, False, head_dim, dtype, device) != block_size_for(
            mask, True, head_dim, dtype, device
        )

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
        grad: bool = True,
    ) -> Prepared:
        if form != "blockmask":
            raise Unsupported(f"flex takes the blockmask form, not {form!r}")
        if mask.per_head and heads_kv != mask.heads:
            raise Unsupported(f"mask has {mask.heads} KV heads, cell has {heads_kv}")
        from longca.masks.flex import to_block_mask

        device = torch.device(device)
        if device.type == "cpu" and dtype not in CPU_DTYPES:
            raise Unsupported(
                f"FlexAttention on CPU takes {sorted(str(d) for d in CPU_DTYPES)}, not {dtype} "
                f"(torch's CPU lowering refuses it)"
            )
        t0 = time.perf_counter()
        block_size, options, forward_only = self._grid(mask, grad, head_dim, dtype, device)
        block_mask = to_block_mask(
            mask,
            block_size=block_size,
            device=device,
            heads_q=heads_q if mask.per_head else None,
            backward=not forward_only,
        )
        sync(device)
        build_s = time.perf_counter() - t0

        def call(q, k, v):
            if forward_only and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
                raise Unsupported(
                    f"this BlockMask (block {block_size}) was built for the forward only: torch's "
                    f"Flex backward has no config for it on this GPU (prepare with grad=True)"
                )
            return flex_call(q, k, v, block_mask, options)

        if device.type == "cpu":

            def call(q, k, v, _call=call):  # noqa: F811 - the CPU variant refuses a backward up front
                if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
                    raise Unsupported("FlexAttention has no backward on CPU (torch raises NotImplementedError)")
                return _call(q.detach(), k.detach(), v.detach())  # torch refuses requires_grad inputs

        backend = f"{self.backend_label} blockmask {block_size}"
        if options:
            backend += " tiles " + ",".join(f"{k}={v}" for k, v in options.items())
        info = {
            "backend": backend,
            "block_size": block_size,
            "forward_only": forward_only,
            "mask_mod_layers": getattr(block_mask.mask_mod, "layers", None),
            "blocks_partial": int(block_mask.kv_num_blocks.sum()),
            "blocks_full": int(block_mask.full_kv_num_blocks.sum()) if block_mask.full_kv_num_blocks is not None else 0,
        }
        return Prepared(call=call, layout=self.layout, build_s=build_s, info=info, extra={"block_mask": block_mask})

    backend_label = "flex"

    def _grid(self, mask: Mask, grad: bool, head_dim: int, dtype: torch.dtype, device: torch.device):
        """(BlockMask block size, kernel_options, forward only) of this backend for one cell."""
        block_size = block_size_for(mask, grad, head_dim, dtype, device)
        forward_only = not grad and not backward_runs_at(block_size, head_dim, dtype, device)
        return block_size, kernel_options_for(block_size), forward_only


class FlexAttentionFlash(FlexAttention):
    """FlexAttention on its FlashAttention-4 backend (`kernel_options={"BACKEND": "FLASH"}`, torch
    >= 2.11 with `flash-attn-4` installed): the same compiled flex_attention and the same BlockMask
    (128 x 128 blocks from the slices, the mask_mod reading per-query key intervals), lowered by
    Inductor to FA4's CuTe kernels instead of Flex's Triton template. Forward and backward on sm90
    (H100/H200) and sm100; fp16/bf16. Head dims 64 and 128 ran on the H200; at 256 FA4's sm90
    kernel refuses the BlockMask ("Block sparsity requires sparse_block_size[1] to be a multiple of
    tile_n=80": its 256-wide tiles are 80 keys, which no 128-block divides), so 256 is not
    declared (docs/kernels.md records what the H200 showed)."""

    name = "flex_fa4"
    backend_label = "flex FLASH (FA4)"
    description = "FlexAttention compiled with its FLASH backend (FlashAttention-4 CuTe kernels), BlockMask 128"
    caps = Capabilities(
        mask_forms=frozenset({"blockmask"}),
        dtypes=frozenset({"float16", "bfloat16"}),
        devices=frozenset({"cuda"}),
        head_dims=frozenset({64, 128}),
        gqa=True,
        backward=True,
        min_compute_capability=(9, 0),
        package="flash_attn.cute",
        retained_backward=True,
    )

    def grad_changes_form(self, mask: Mask, *, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
        return False

    def _grid(self, mask: Mask, grad: bool, head_dim: int, dtype: torch.dtype, device: torch.device):
        # FA4's tiles on sm90 are 128 x 128 (head dims <= 128): the 128 grid, forward and backward
        return BLOCK_SIZE, {"BACKEND": "FLASH"}, False


register(FlexAttention())
register(FlexAttentionFlash())

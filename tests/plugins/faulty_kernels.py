"""Deliberately broken kernels, registered only in tests (LONGCA_PLUGINS=faulty_kernels).

Each fails in one way a real kernel can: wrong numbers (everywhere, or only beyond the check length: its
output or its gradients), a crash, a hang, an exception, an
out-of-memory error (always, or only with more than 2 heads a call), or an impossible speed. The pipeline must turn each into the right row.
One is right but slow (`test_slow`: 1 s a call), for time limits that must not fire.
The hang and segfault kernels are CP per-rank kernels too, failing on rank 1 only, so rank 0 is left
waiting in a collective, as when one GPU of a group fails.

Also fla's simple GLA adapters (longca.kernels.adapters.linear_fla) with a CPU stand-in for fla's
Triton function, which needs a GPU: the chunked and the recurrent float64 references, cast back, so
a linear-attention cell and its full-length comparator run through the real adapter on the CPU; one
stand-in is 5% off beyond the check length.
"""

import dataclasses
import os
import signal
import time

import torch

from longca.kernels.adapters.linear_fla import CAPS as FLA_CAPS
from longca.kernels.adapters.linear_fla import OPS, RECURRENT_OPS, FlaLinearKernel, FlaOp
from longca.kernels.adapters.naive import NaiveAttention, RankNaive
from longca.kernels.base import Capabilities, Prepared, RankCapabilities
from longca.kernels.linear import FAMILIES
from longca.kernels.linear import reference as ref
from longca.kernels.registry import KERNELS, register

RANK_CAPS = RankCapabilities(devices=frozenset({"cpu", "cuda"}), dtypes=frozenset({"float32", "float64"}))
CAPS = Capabilities(
    mask_forms=frozenset({"full", "dense"}),
    dtypes=frozenset({"float32", "float64"}),
    devices=frozenset({"cpu", "cuda"}),
    cp=RANK_CAPS,
)
_naive = NaiveAttention()


class Faulty:
    layout = "bhsd"
    caps = CAPS

    def __init__(self, name, mode):
        self.name = name
        self.mode = mode
        self.description = f"test kernel that fails by: {mode}"

    def rank_kernel(self):
        rank_kernel = FaultyRank()
        rank_kernel.name, rank_kernel.mode = self.name, self.mode
        return rank_kernel

    def prepare(self, mask, **kw):
        good = _naive.prepare(mask, **kw)
        mode = self.mode
        cached = {}

        def call(q, k, v):
            if mode == "wrong":
                return good.call(q, k, v) * 1.01  # 1% off: must be caught as incorrect
            if mode == "wrong_long" and q.shape[2] > 128:
                # right at the check length, 5% off beyond it: only full-length agreement sees it
                return good.call(q, k, v) * 1.05
            if mode == "wrong_grad_long" and q.shape[2] > 128:
                # the output right everywhere, dQ 5% off beyond the check length: only a full-length
                # agreement of the gradients sees it (as an index overflow in a long backward would)
                return good.call(_ScaleGrad.apply(q, 1.05), k, v)
            if mode == "segfault" and q.shape[2] > 128:
                os.kill(os.getpid(), signal.SIGSEGV)
            if mode == "hang" and q.shape[2] > 128:
                time.sleep(3600)
            if mode == "slow" and q.shape[2] > 128:
                time.sleep(1.0)  # right, but every timed call takes 1 s: a long cell, not a hung one
            if mode == "raise" and q.shape[2] > 128:
                raise RuntimeError("deliberate failure inside the kernel")
            if mode == "oom" and q.shape[2] > 128:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 TiB (deliberate)")
            if mode == "oom_wide" and q.shape[2] > 128 and q.shape[1] > 2:
                # out of memory beyond the check length unless given at most 2 heads a call (a
                # comparator whose partial results scale with the heads: run over head groups)
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 100.00 GiB (deliberate)")
            if mode == "too_fast" and q.shape[2] > 128:
                # Correct output, returned without computing: the speed is impossible.
                key = id(q)
                if key not in cached:
                    cached.clear()
                    cached[key] = good.call(q, k, v).detach()
                return cached[key].requires_grad_(q.requires_grad)
            return good.call(q, k, v)

        return Prepared(call=call, layout=self.layout, info={"backend": "test"})


class _ScaleGrad(torch.autograd.Function):
    """The identity forward; the backward scales the gradient."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


class FaultyRank(RankNaive):
    """CP per-rank kernel failing on rank 1 (hang, segfault; the other modes compute correctly); with
    LONGCA_TEST_PID_DIR set, every rank first leaves RANK-PID there, so a test can tell when the
    fault starts and check that no rank survives it."""

    mode = ""

    def fwd(self, q, k, v, sub):
        pid_dir = os.environ.get("LONGCA_TEST_PID_DIR")
        if pid_dir:
            open(os.path.join(pid_dir, f"{os.environ.get('RANK')}-{os.getpid()}"), "w").close()
        if os.environ.get("RANK") == "1":
            if self.mode == "hang":
                time.sleep(3600)
            if self.mode == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
        return super().fwd(q, k, v, sub)


_MODES = ("wrong", "wrong_long", "wrong_grad_long", "segfault", "hang", "raise", "oom", "oom_wide", "too_fast", "slow")
for _mode in _MODES:
    if f"test_{_mode}" not in KERNELS:
        register(Faulty(f"test_{_mode}", _mode))


@dataclasses.dataclass(frozen=True)
class CpuFlaOp(FlaOp):
    """fla's op as the adapter calls it, computed on the CPU by the family's float64 reference."""

    recurrent: bool = False
    wrong_long: bool = False

    def load(self):
        def fla_function(q, k, v, g=None, gk=None, scale=None, cu_seqlens=None, cu_seqlens_cpu=None, **fixed):
            form = ref.gla_recurrent if self.recurrent else ref.gla_chunk
            o = form(q, k, v, g=g, gk=gk, scale=scale, cu_seqlens=cu_seqlens).to(q.dtype)
            if self.wrong_long and q.shape[1] > 128:
                o = o * 1.05  # right at the check length, 5% off beyond it
            return o, None

        return fla_function


CPU_LINEAR_CAPS = dataclasses.replace(
    FLA_CAPS, devices=frozenset({"cpu"}), dtypes=frozenset({"float32", "float64"}), head_dims=None, package=None
)
for _name, _op, _kw in (
    ("test_simple_gla_chunk", OPS["simple_gla"], {}),
    ("test_simple_gla_recurrent", RECURRENT_OPS["simple_gla"], {"recurrent": True}),
    ("test_simple_gla_wrong_long", OPS["simple_gla"], {"wrong_long": True}),
):
    if _name not in KERNELS:
        _cpu_op = CpuFlaOp(**{f.name: getattr(_op, f.name) for f in dataclasses.fields(FlaOp)}, **_kw)
        register(FlaLinearKernel(FAMILIES["simple_gla"], _cpu_op, _name, CPU_LINEAR_CAPS))

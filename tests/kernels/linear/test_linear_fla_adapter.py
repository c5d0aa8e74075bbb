"""The fla adapters: declared capabilities, mask handling, packing, GQA, extra inputs, the
reference and FLOPs handed to the runner. fla's Triton kernels need a GPU (they do not run under
TRITON_INTERPRET=1, see docs/linear.md), so the kernel-vs-reference test runs only with CUDA."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

from longca.kernels import registry
from longca.kernels.adapters import linear_fla
from longca.kernels.base import Unsupported, static_unsupported_reason
from longca.kernels.linear import MODELS, linear_flops
from longca.masks import regular
from longca.masks.forms import forms_of
from longca.masks.mask import Mask
from longca.masks.registry import PATTERNS, build_mask

CHUNKED = ["fla_linear_attn", "fla_simple_gla", "fla_gla", "fla_gated_deltanet"]
NAMES = CHUNKED + [f"{name}_recurrent" for name in CHUNKED]  # each family's fused recurrent form
CPU = torch.device("cpu")


def _doc_mask(docs: tuple[int, ...]) -> Mask:
    s = sum(docs)
    return Mask("causal_document", s, s, regular.causal_document(docs), {"distribution": "uniform"}, docs)


def _prepare(name: str, mask: Mask, *, batch=2, hq=4, hkv=2, d=16, dtype=torch.float64, device=CPU):
    form = "varlen" if mask.name == "causal_document" else "causal"
    return registry.get(name).prepare(
        mask, batch=batch, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=dtype, device=device, form=form
    )


@pytest.mark.parametrize("name", NAMES)
def test_registered_as_linear_family_on_causal_masks_only(name: str) -> None:
    kernel = registry.get(name)
    caps = kernel.caps
    assert caps.family == "linear" and caps.package == "fla" and caps.computes == kernel.family.name
    # fla's recurrent gated delta rule raises NotImplementedError in backward: declared, so planned
    assert caps.backward == (name != "fla_gated_deltanet_recurrent")
    assert kernel.op.flop_model in MODELS and kernel.op.flop_model.startswith("linear_")
    reason = lambda mask, pass_="fwd": static_unsupported_reason(  # noqa: E731
        caps,
        mask_name=mask,
        mask_forms=forms_of(mask),
        dtype="bfloat16",
        head_dim=128,
        heads_q=8,
        heads_kv=2,
        pass_=pass_,
        device="cuda",
    )
    assert reason("causal") is None and reason("causal_document") is None
    assert (reason("causal", "fwd_bwd") is None) == caps.backward
    for other in sorted(set(PATTERNS) - {"causal", "causal_document"}):
        assert reason(other) is not None, other
    assert static_unsupported_reason(
        caps,
        mask_name="causal",
        mask_forms=forms_of("causal"),
        dtype="bfloat16",
        head_dim=128,
        heads_q=8,
        heads_kv=8,
        pass_="fwd",
        device="cpu",
    )


def test_prepare_refuses_other_masks_and_uneven_groups() -> None:
    kernel = registry.get("fla_simple_gla")
    with pytest.raises(Unsupported):
        kernel.prepare(
            build_mask("full", 64),
            batch=1,
            heads_q=2,
            heads_kv=2,
            head_dim=16,
            dtype=torch.float32,
            device=CPU,
            form="full",
        )
    with pytest.raises(Unsupported):
        _prepare("fla_simple_gla", build_mask("causal", 64), hq=6, hkv=4)


def test_varlen_packs_the_batch_documents() -> None:
    cu = linear_fla.packed_cu_seqlens(_doc_mask((5, 20, 7)), batch=2)
    assert cu.tolist() == [0, 5, 25, 32, 37, 57, 64]


@pytest.mark.parametrize("name", NAMES)
def test_extra_inputs_seeded_and_shaped(name: str) -> None:
    a = _prepare(name, build_mask("causal", 64)).extra
    b = _prepare(name, build_mask("causal", 64)).extra
    fam = registry.get(name).family
    assert a["inputs"].keys() == b["inputs"].keys()
    for key, x in a["inputs"].items():
        assert torch.equal(x, b["inputs"][key]) and not x.requires_grad
    if fam.gate == "head":
        assert a["inputs"]["g"].shape == (2, 64, 4)
    if fam.gate == "key":
        assert a["inputs"]["gk"].shape == (2, 64, 4, 16)
    for key in ("g", "gk"):
        if key in a["inputs"]:
            decay = a["inputs"][key].exp()
            assert decay.max() < 1.0 and decay.median() > 0.99  # a decay, with a memory of hundreds of tokens
    if fam.beta:
        beta = a["inputs"]["beta"]
        assert beta.min() > 0 and beta.max() < 1
    varlen = _prepare(name, _doc_mask((30, 34))).extra["inputs"]
    for x in varlen.values():
        assert x.shape[:2] == (1, 128)  # batch folded into one packed sequence


@pytest.mark.parametrize("name", NAMES)
def test_flops_follow_the_family_model(name: str) -> None:
    extra = _prepare(name, build_mask("causal", 64), batch=3, hq=4, hkv=1, d=16).extra
    assert extra["kernel_family"] == "linear"
    passes = ["fwd", "bwd", "fwd_bwd"] if registry.get(name).caps.backward else ["fwd"]
    assert sorted(extra["flops"]) == sorted(passes)
    for p in passes:
        assert extra["flops"][p] == linear_flops(extra["flop_model"], tokens=3 * 64, heads_q=4, head_dim=16, pass_=p)
    if name.endswith("_recurrent"):  # one step per token, no chunk terms
        per_token = {"fla_gated_deltanet_recurrent": 6}.get(name, 4) * 16 * 16
        assert extra["flops"]["fwd"] == 3 * 64 * 4 * per_token


@pytest.mark.parametrize("name", CHUNKED)
@pytest.mark.parametrize("mask", ["causal", "causal_document"])
def test_the_recurrent_form_gets_the_same_gates_and_reference(name: str, mask: str) -> None:
    """The full-length comparison is of one function on one input: the recurrent kernel of a family
    draws the very gates (and beta) the chunked one does, and hands the runner the same reference."""
    m = build_mask("causal", 96) if mask == "causal" else _doc_mask((30, 66))
    chunked, recurrent = _prepare(name, m).extra, _prepare(f"{name}_recurrent", m).extra
    assert chunked["inputs"].keys() == recurrent["inputs"].keys()
    for key, x in chunked["inputs"].items():
        assert torch.equal(x, recurrent["inputs"][key])
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 96, 4, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 96, 2, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    assert torch.equal(chunked["reference"](q, k, v), recurrent["reference"](q, k, v))


@pytest.mark.parametrize("name", NAMES)
def test_reference_is_per_document_recurrence_with_gqa(name: str) -> None:
    """The runner's reference (bshd in, bshd out) equals the exact recurrence run on each batch
    element and document alone, with k/v heads repeated per query-head group."""
    docs = (9, 20, 3)
    batch, hq, hkv, d = 2, 4, 2, 8
    prepared = _prepare(name, _doc_mask(docs), batch=batch, hq=hq, hkv=hkv, d=d)
    fam = registry.get(name).family
    s = sum(docs)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, s, hq, d, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(batch, s, hkv, d, generator=gen, dtype=torch.float64) for _ in range(2))
    out = prepared.extra["reference"](q, k, v)
    assert out.shape == (batch, s, hq, d) and out.dtype == torch.float64
    inputs = prepared.extra["inputs"]
    bounds = np.concatenate([[0], np.cumsum(docs)])
    for b in range(batch):
        for lo, hi in zip(bounds, bounds[1:]):
            t0, t1 = b * s + lo, b * s + hi  # packed positions of this document
            part = {key: x[:, t0:t1] for key, x in inputs.items()}
            one = lambda x: x[b : b + 1, lo:hi]  # noqa: E731
            expect = fam.reference_recurrent(
                one(q), one(k).repeat_interleave(2, dim=2), one(v).repeat_interleave(2, dim=2), part, None
            )
            torch.testing.assert_close(out[b : b + 1, lo:hi], expect, rtol=1e-10, atol=1e-10)
    thd = prepared.extra["reference"](
        q.reshape(batch * s, hq, d), k.reshape(batch * s, hkv, d), v.reshape(batch * s, hkv, d)
    )
    torch.testing.assert_close(thd, out.reshape(batch * s, hq, d))


@pytest.mark.parametrize("name", NAMES)
def test_fla_signature_takes_our_arguments(name: str) -> None:
    """Guards against fla API drift: every keyword we pass is a parameter of the installed function."""
    import fla  # noqa: F401  (the test extra installs fla-core: a missing one fails, never skips)

    op = registry.get(name).op
    params = inspect.signature(op.load()).parameters
    inputs = {key: torch.zeros(1) for key in op.extra_args.values()}
    cu = torch.tensor([0, 4])
    for kw in linear_fla.fla_kwargs(op, inputs, scale=0.1, cu_seqlens=cu, cu_seqlens_cpu=cu):
        assert kw in params, f"{op.function} has no parameter {kw!r}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's Triton kernels need a GPU")
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mask", ["causal", "causal_document"])
def test_fla_matches_reference_on_gpu(name: str, mask: str) -> None:
    import fla  # noqa: F401  (the test extra installs fla-core: a missing one fails, never skips)

    dev = torch.device("cuda")
    m = build_mask("causal", 512) if mask == "causal" else _doc_mask((100, 300, 1, 111))
    prepared = _prepare(name, m, batch=2, hq=4, hkv=2, d=64, dtype=torch.bfloat16, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    shape = lambda h: (2, m.seqlen_q, h, 64)  # noqa: E731
    q64 = torch.randn(shape(4), generator=gen, device=dev, dtype=torch.float64)
    k64, v64 = (torch.randn(shape(2), generator=gen, device=dev, dtype=torch.float64) for _ in range(2))
    do = torch.randn(shape(4), generator=gen, device=dev, dtype=torch.float64)
    xs = [x.to(torch.bfloat16).requires_grad_(True) for x in (q64, k64, v64)]
    rs = [x.detach().to(torch.float64).requires_grad_(True) for x in xs]  # the very same (rounded) inputs
    out = prepared.call(*xs)
    ref = prepared.extra["reference"](*rs)
    tol = linear_fla.TOLERANCE["bfloat16"]
    rel = lambda a, b: float((a.double() - b).norm() / b.norm())  # noqa: E731
    assert rel(out, ref) < tol
    if not registry.get(name).caps.backward:
        return
    if registry.get(name).backward_refusal(dev):
        pytest.skip(registry.get(name).backward_refusal(dev))
    out.backward(do.to(torch.bfloat16))
    ref.backward(do)
    for x, r in zip(xs, rs):
        assert rel(x.grad, r.grad) < 3 * tol


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fla's Triton kernels need a GPU")
@pytest.mark.parametrize("name", CHUNKED)
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_a_long_linear_cell_agrees_with_its_recurrent_form_on_gpu(name: str, pass_: str) -> None:
    """The full-length agreement on fla's kernels (run on the H200): a cell beyond the check length
    is compared with its own family's recurrent kernel, output and (backward) gradients."""
    import fla  # noqa: F401  (the test extra installs fla-core: a missing one fails, never skips)

    from longca.run.cell import run_cell
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    recurrent = ", ".join(f"{n}_recurrent" for n in CHUNKED)
    spec = load_spec(
        text=f"""
name: t
device: cuda
repeat: {{warmup: 1, iters: 3, min_iters: 3, budget_s: 1.0}}
kernels: [{name}]
masks: [causal_document]
mask_samples: {{multi_document: 1, single: 1}}
seqlens: [4096]
heads: ["8:2"]
head_dims: [128]
dtypes: [bfloat16]
passes: [{pass_}]
check: {{max_seqlen: 1024, agree_with: [fa4, {recurrent}]}}
sweeps: [{{name: s}}]
"""
    )
    (cell,) = expand(spec)
    assert cell.check_dict["agree_with"] == [f"{name}_recurrent"]
    (row,) = run_cell(cell)
    refusal = pass_ == "bwd" and registry.get(name).backward_refusal(torch.device("cuda"))
    if refusal:
        assert row["status"] == "unsupported" and "#640" in row["reason"]
        return
    assert row["status"] == "ok", row["reason"]
    if pass_ == "bwd" and not registry.get(f"{name}_recurrent").caps.backward:
        # fla's recurrent gated delta rule has no backward: the row says none serves, and why
        assert row.get("agree_kernel") is None and "no backward pass" in row["agree_reason"]
        return
    assert row["agree_kernel"] == f"{name}_recurrent" and row["check_seqlen"] == 1024
    names = ["agree_rel_diff"] + (
        ["agree_rel_diff_dq", "agree_rel_diff_dk", "agree_rel_diff_dv"] if pass_ == "bwd" else []
    )
    for column in names:
        assert 0 <= row[column] < linear_fla.TOLERANCE["bfloat16"], (column, row[column])


def test_gated_backward_refused_where_fla_refuses_it() -> None:
    from longca.kernels.adapters.linear_fla import OPS, gated_backward_refusal

    hopper_36 = {
        "triton": "3.6.0",
        "fla": "0.6.0",
        "tilelang": False,
        "IS_NVIDIA_HOPPER": True,
        "TRITON_ABOVE_3_4_0": True,
        "TRITON_ABOVE_3_7_1": False,
    }
    reason = gated_backward_refusal(hopper_36, (9, 0))
    assert reason and "Triton 3.6.0" in reason and "#640" in reason
    assert gated_backward_refusal({**hopper_36, "TRITON_ABOVE_3_7_1": True}, (9, 0)) is None
    assert gated_backward_refusal({**hopper_36, "tilelang": True}, (9, 0)) is None
    assert gated_backward_refusal({**hopper_36, "IS_NVIDIA_HOPPER": False}, (8, 0)) is None
    assert gated_backward_refusal({**hopper_36, "TRITON_ABOVE_3_4_0": False}, (9, 0)) is None
    # the gated families whose backward runs through chunk_bwd_dqkwg with a gate
    assert {name for name, op in OPS.items() if op.gated_dqkwg} == {"simple_gla", "gated_deltanet"}
    # the recurrent forms do not go through chunk_bwd_dqkwg (fla.ops.common.fused_recurrent)
    assert not any(op.gated_dqkwg for op in linear_fla.RECURRENT_OPS.values())


def test_backward_refusal_reads_fla_flags_and_passes_on_cpu() -> None:
    import fla  # noqa: F401  (the test extra installs fla-core: a missing one fails, never skips)

    from longca.kernels.adapters.linear_fla import dqkwg_guard_flags
    from longca.kernels.registry import get

    flags = dqkwg_guard_flags()
    assert set(flags) >= {"IS_NVIDIA_HOPPER", "TRITON_ABOVE_3_4_0", "TRITON_ABOVE_3_7_1", "triton"}
    assert get("fla_gated_deltanet").backward_refusal(torch.device("cpu")) is None
    assert get("fla_linear_attn").backward_refusal(torch.device("cuda")) is None  # ungated: never asks

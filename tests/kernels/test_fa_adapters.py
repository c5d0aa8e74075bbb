"""fa2 / fa3 / fa4 adapters: declared capabilities, clean `unsupported` without their packages, and
the mask -> argument mapping (causal flag, window sizes, cu_seqlens, FA4 interval table), checked
by attending with those arguments in float64 and comparing to the dense-mask reference.

The kernels themselves need their packages and a GPU (sm80+/sm90); where present, the last test
runs each adapter against the float64 reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longca.kernels import registry
from longca.kernels.adapters._flash_args import (
    batched_cu_seqlens,
    dense_from_intervals,
    flash_mask_args,
    interval_table,
    packed,
)
from longca.kernels.base import MASK_FORMS, Unsupported, package_available
from longca.masks.registry import PATTERNS, build_mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error

S, D = 192, 8
SMALL_PARAMS = {"window": 24, "global_tokens": 8, "prefix": 70, "block": 32}
FLASH = ("fa2", "fa3", "fa4")
PACKAGES = {"fa2": "flash_attn.flash_attn_interface", "fa3": "flash_attn_interface", "fa4": "flash_attn.cute"}


def small_params(name: str) -> dict:
    return {p.name: SMALL_PARAMS[p.name] for p in PATTERNS[name].params if p.name in SMALL_PARAMS}


def static_masks() -> list[str]:
    return sorted(n for n, p in PATTERNS.items() if p.family != "dynamic")


def flash_semantics(q, k, v, causal: bool, window: tuple[int, int], cu_seqlens=None):
    """What a flash kernel computes, written out in float64 (bshd, or thd with cu_seqlens):
    within each segment, query i attends keys j with i - left <= j <= i + right (-1: unbounded),
    j <= i when causal. GQA: query head h uses KV head h // (Hq / Hkv)."""
    if cu_seqlens is None:
        b, s = q.shape[:2]
        cu_seqlens = np.arange(0, b * s + 1, s)
        q, k, v = (t.reshape(b * s, *t.shape[2:]) for t in (q, k, v))
    else:
        b = None
    out = torch.zeros_like(q)
    g = q.shape[1] // k.shape[1]
    left, right = window
    for a, e in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        i = torch.arange(e - a)[:, None]
        j = torch.arange(e - a)[None, :]
        allowed = torch.ones(e - a, e - a, dtype=torch.bool)
        if causal:
            allowed &= j <= i
        if left >= 0:
            allowed &= j >= i - left
        if right >= 0:
            allowed &= j <= i + right
        qs = q[a:e].transpose(0, 1)
        ks = k[a:e].transpose(0, 1).repeat_interleave(g, 0)
        vs = v[a:e].transpose(0, 1).repeat_interleave(g, 0)
        sc = (qs @ ks.transpose(-1, -2)) / np.sqrt(q.shape[-1])
        p = torch.softmax(sc.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
        out[a:e] = (p @ vs).transpose(0, 1)
    return out if b is None else out.reshape(b, -1, *out.shape[1:])


def qkv(batch, hq=4, hkv=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, S, h, D, generator=gen, dtype=torch.float64) for h in (hq, hkv, hkv))


@pytest.mark.parametrize("name", FLASH)
def test_capabilities_are_declared_as_data(name):
    kernel = registry.get(name)
    caps = kernel.caps
    assert kernel.layout == "bshd"
    assert caps.package == PACKAGES[name]
    assert caps.devices == frozenset({"cuda"})
    assert caps.dtypes == frozenset({"float16", "bfloat16"})
    assert caps.gqa and caps.backward
    assert {"full", "causal", "window", "varlen"} <= caps.mask_forms <= set(MASK_FORMS)
    assert caps.min_compute_capability >= (8, 0)
    assert max(caps.head_dims) <= 256


def test_fa4_declares_sm90_and_mask_mod_form():
    caps = registry.get("fa4").caps
    assert caps.min_compute_capability == (9, 0)
    assert "slices" in caps.mask_forms
    assert {64, 128, 256} <= caps.head_dims
    assert registry.get("fa3").caps.min_compute_capability == (9, 0)
    assert registry.get("fa2").caps.min_compute_capability == (8, 0)


@pytest.mark.parametrize("name", FLASH)
def test_absent_package_is_unsupported_not_a_crash(name):
    kernel = registry.get(name)
    if package_available(kernel.caps.package):
        pytest.skip(f"{kernel.caps.package} is installed here")
    mask = build_mask("causal", S)
    with pytest.raises(Unsupported, match=f"{kernel.caps.package} not installed"):
        kernel.prepare(
            mask,
            batch=1,
            heads_q=4,
            heads_kv=2,
            head_dim=64,
            dtype=torch.bfloat16,
            device=torch.device("cpu"),
            form="causal",
        )


def test_batched_cu_seqlens_offsets_every_sequence():
    cu = batched_cu_seqlens(np.array([0, 3, 10]), 10, 3)
    assert cu.dtype == np.int32
    assert cu.tolist() == [0, 3, 10, 13, 20, 23, 30]
    assert batched_cu_seqlens(np.array([0, 10]), 10, 1).tolist() == [0, 10]
    with pytest.raises(ValueError):
        batched_cu_seqlens(np.array([0, 4, 9]), 10, 2)


@pytest.mark.parametrize(
    "name,form",
    [
        ("full", "full"),
        ("causal", "causal"),
        ("sliding_window", "window"),
        ("causal_sliding_window", "window"),
        ("full", "window"),
        ("causal", "window"),
        ("full", "varlen"),
        ("causal", "varlen"),
        ("full_document", "varlen"),
        ("causal_document", "varlen"),
    ],
)
@pytest.mark.parametrize("batch", [1, 2])
def test_flash_arguments_attend_exactly_the_mask(name, form, batch):
    mask = build_mask(name, S, small_params(name), seed=5)
    if name.endswith("document"):
        assert len(mask.documents) > 1  # a real multi-document case
    args = flash_mask_args(mask, form, batch)
    q, k, v = qkv(batch)
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cpu")))
    if form == "varlen":
        assert args.layout == "thd" and args.cu_seqlens[-1] == batch * S
        assert args.max_seqlen == int(np.diff(args.cu_seqlens).max())
        packed = [t.reshape(batch * S, *t.shape[2:]) for t in (q, k, v)]
        got = flash_semantics(*packed, args.causal, args.window, args.cu_seqlens).reshape(ref.shape)
    else:
        assert args.layout == "bshd" and args.cu_seqlens is None
        got = flash_semantics(q, k, v, args.causal, args.window)
    assert relative_error(got, ref) < 1e-12


def test_packed_varlen_call_takes_and_returns_bshd():
    """fa2/3/4 keep layout bshd in the varlen form: the packed wrapper views (B, S, H, D) as
    (B*S, H, D) for the varlen function and the result back, documents of each element intact."""
    batch = 2
    mask = build_mask("causal_document", S, seed=5)
    args = flash_mask_args(mask, "varlen", batch)
    q, k, v = qkv(batch)
    call = packed(lambda *t: flash_semantics(*t, args.causal, args.window, args.cu_seqlens), batch, S)
    out = call(q, k, v)
    assert out.shape == q.shape
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cpu")))
    assert relative_error(out, ref) < 1e-12


def test_window_sizes_follow_flash_convention():
    sw = build_mask("sliding_window", S, {"window": 24})
    csw = build_mask("causal_sliding_window", S, {"window": 24})
    assert flash_mask_args(sw, "window").window == (24, 24)
    assert flash_mask_args(csw, "window").window == (24, 0)
    assert flash_mask_args(csw, "window").window_or_none() == (24, 0)
    assert flash_mask_args(build_mask("full", S), "full").window_or_none() == (None, None)
    assert flash_mask_args(build_mask("causal", S), "causal").causal


def test_forms_that_cannot_express_the_mask_are_unsupported():
    with pytest.raises(Unsupported):
        flash_mask_args(build_mask("causal", S), "full")
    with pytest.raises(Unsupported):
        flash_mask_args(build_mask("prefix_lm_causal", S, {"prefix": 70}), "slices")
    with pytest.raises(ValueError):
        flash_mask_args(build_mask("prefix_lm_causal", S, {"prefix": 70}), "varlen")


@pytest.mark.parametrize("name", static_masks())
def test_fa4_interval_table_is_the_mask(name):
    mask = build_mask(name, S, small_params(name), seed=7)
    table, layers = interval_table(mask, pad_rows=64)
    assert table.dtype == np.int32 and layers >= 1
    assert table.size == (S + 64) * layers * 2
    assert np.array_equal(dense_from_intervals(table, layers, S, S), mask.dense())
    padded = table.reshape(-1, layers, 2)[S:]
    assert (padded[:, :, 0] >= padded[:, :, 1]).all()  # padding rows attend nothing


def test_fa4_interval_table_refuses_per_head_masks():
    mask = build_mask("block_sparse", 256, {"block": 64}, heads_kv=2)
    with pytest.raises(Unsupported):
        interval_table(mask)


ON_GPU = torch.cuda.is_available()


@pytest.mark.skipif(not ON_GPU, reason="flash kernels need a CUDA GPU")
@pytest.mark.parametrize("kernel_name", FLASH)
@pytest.mark.parametrize("name", ["full", "causal", "sliding_window", "causal_document", "prefix_lm_causal"])
def test_kernel_matches_reference_on_gpu(kernel_name, name):
    kernel = registry.get(kernel_name)
    if not package_available(kernel.caps.package):
        pytest.skip(f"{kernel.caps.package} not installed")
    major_minor = torch.cuda.get_device_capability()
    if major_minor < kernel.caps.min_compute_capability:
        pytest.skip("GPU too old")
    from longca.kernels.base import choose_form
    from longca.masks.forms import forms_of

    s, hd, b = 512, 64, 2
    mask = build_mask(
        name, s, {"sliding_window": {"window": 60}, "prefix_lm_causal": {"prefix": 100}}.get(name), seed=1
    )
    try:
        form = choose_form(kernel.caps, forms_of(name))
    except Unsupported:
        pytest.skip("no common form")
    dev = torch.device("cuda")
    prepared = kernel.prepare(
        mask, batch=b, heads_q=4, heads_kv=2, head_dim=hd, dtype=torch.bfloat16, device=dev, form=form
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, s, h, hd, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cpu")))
    ins = [t.to(dev, torch.bfloat16) for t in (q, k, v)]
    if prepared.layout == "thd":
        ins = [t.reshape(b * s, *t.shape[2:]) for t in ins]
    out = prepared.call(*ins).reshape(ref.shape)
    assert relative_error(out.float().cpu(), ref) < 2e-2

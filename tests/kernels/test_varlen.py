"""The "varlen" adapter (torch.nn.attention.varlen.varlen_attn).

varlen_attn runs on CUDA only (its flash kernel has no CPU implementation), so on CPU these tests
check the declared capabilities and the argument mapping against this torch's real signature and
against the older signatures; with a GPU they check outputs and gradients against float64.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from longca.kernels import registry
from longca.kernels.adapters.varlen import varlen_kwargs
from longca.kernels.base import Unsupported, package_available
from longca.masks.registry import PATTERNS, build_mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error

ON_GPU = torch.cuda.is_available()


@pytest.fixture(scope="module")
def varlen():
    return registry.get("varlen")


def test_declared_capabilities(varlen):
    caps = varlen.caps
    assert varlen.layout == "thd"
    assert caps.mask_forms == frozenset({"varlen"})
    assert caps.devices == frozenset({"cuda"})
    assert caps.dtypes == frozenset({"float16", "bfloat16"})
    assert caps.min_compute_capability == (8, 0)
    assert package_available(caps.package)  # present in every torch this project supports


def test_document_masks_offer_the_varlen_form():
    for name in ("full", "causal", "full_document", "causal_document"):
        assert "varlen" in PATTERNS[name].forms


def test_kwargs_for_this_torch_signature():
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal = varlen_kwargs(params, causal=True, gqa=False)
    full = varlen_kwargs(params, causal=False, gqa=False)
    assert causal != full
    if "window_size" in params:
        assert causal == {"window_size": (-1, 0)} and full == {"window_size": (-1, -1)}
    if "enable_gqa" in params:
        assert varlen_kwargs(params, causal=True, gqa=True)["enable_gqa"] is True


def test_kwargs_for_other_signatures():
    assert varlen_kwargs({"is_causal": None}, causal=True, gqa=False) == {"is_causal": True}
    assert varlen_kwargs({"window_size": None, "is_causal": None}, causal=False, gqa=False) == {"window_size": (-1, -1)}
    with pytest.raises(Unsupported, match="enable_gqa"):
        varlen_kwargs({"window_size": None}, causal=True, gqa=True)
    with pytest.raises(Unsupported):
        varlen_kwargs({}, causal=True, gqa=False)
    assert varlen_kwargs({}, causal=False, gqa=False) == {}


def test_non_varlen_form_is_unsupported(varlen):
    with pytest.raises(Unsupported):
        varlen.prepare(
            build_mask("causal", 128),
            batch=1,
            heads_q=2,
            heads_kv=2,
            head_dim=64,
            dtype=torch.bfloat16,
            device=torch.device("cpu"),
            form="causal",
        )


@pytest.mark.skipif(not ON_GPU, reason="varlen_attn runs on CUDA only")
@pytest.mark.parametrize("name", ["full", "causal", "full_document", "causal_document"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)])
def test_matches_reference_on_gpu(varlen, name, heads):
    from torch.nn.attention.varlen import varlen_attn

    hq, hkv = heads
    if hq != hkv and "enable_gqa" not in inspect.signature(varlen_attn).parameters:
        pytest.skip("this torch's varlen_attn has no GQA")
    s, d, b = 512, 64, 2
    mask = build_mask(name, s, seed=2)
    dev = torch.device("cuda")
    prepared = varlen.prepare(
        mask, batch=b, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=torch.bfloat16, device=dev, form="varlen"
    )
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, s, h, d, generator=gen, dtype=torch.float64, requires_grad=True) for h in (hq, hkv, hkv))
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cpu")))
    ins = [t.detach().to(dev, torch.bfloat16).reshape(b * s, *t.shape[2:]).requires_grad_() for t in (q, k, v)]
    out = prepared.call(*ins)
    assert relative_error(out.float().cpu().reshape(ref.shape), ref) < 2e-2
    dout = torch.randn_like(ref)
    ref.backward(dout)
    out.backward(dout.to(dev, torch.bfloat16).reshape(out.shape))
    for got, want in zip(ins, (q, k, v)):
        assert relative_error(got.grad.float().cpu().reshape(want.shape), want.grad) < 3e-2

"""Flex's backward operator on a given (out, LSE): each ring step's share of the gradients.

On the CPU the operator runs eagerly (torch's reference implementation); the compiled CUDA path
compiles the graph `trace` builds, which is checked here to hold no captured tensor and to compute
the same as the eager call."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from longca.cp.reference import reference_attention
from longca.kernels import flex_backward as fb
from longca.kernels.adapters.flex import RankFlex as Flex
from longca.kernels.adapters.naive import RankNaive as Naive
from longca.kernels.lse import combine
from longca.masks import slices as sl
from longca.masks.blocks import BlockLayout
from longca.masks.flex import to_block_mask
from longca.masks.mask import Mask
from longca.masks.registry import build_mask
from longca.measure.reference import relative_error

CPU = torch.device("cpu")


def _inputs(sq, sk, hq=4, hk=2, d=8, seed=3):
    g = torch.Generator().manual_seed(seed)
    q, do = (torch.randn(1, hq, sq, d, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(1, hk, sk, d, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, do


def _every_kind(sq=40, sk=56):
    """FULL, CAUSAL, INVCAUSAL and BICAUSAL slices, rows 0-3 with no key, Sq != Sk."""
    return sl.make_slices(
        [
            (4, 12, 0, 20, sl.Kind.FULL),
            (12, 24, 10, 30, sl.Kind.CAUSAL),
            (24, 32, 30, 50, sl.Kind.INVCAUSAL),
            (32, 40, 40, 56, sl.Kind.BICAUSAL),
            (30, 40, 0, 6, sl.Kind.FULL),
        ]
    )


def test_key_halves_given_the_combined_out_and_lse_add_up_to_the_reference_gradients():
    q, k, v, do = _inputs(40, 56)
    slices = _every_kind()
    ref = reference_attention(q, k, v, slices, do)
    fx = Flex()
    halves = [(0, 28), (28, 56)]
    subs = [fx.prepare(sl.shift_slices(sl.clip_slices(slices, 0, 40, a, b), 0, -a), 40, b - a, CPU) for a, b in halves]
    out, lse = combine([fx.fwd(q, k[:, :, a:b], v[:, :, a:b], s) for (a, b), s in zip(halves, subs)])
    assert relative_error(out, ref[0]) < 1e-12
    assert torch.isinf(lse[..., :4]).all()  # rows with no key anywhere
    dq = torch.zeros_like(q)
    dks, dvs = [], []
    for (a, b), s in zip(halves, subs):
        g = fb.flex_backward(do, q, k[:, :, a:b], v[:, :, a:b], out, lse, s.form)
        assert all(x.dtype == torch.float64 and not x.isnan().any() for x in g)
        dq += g[0]
        dks.append(g[1])
        dvs.append(g[2])
    assert relative_error(dq, ref[1]) < 1e-12
    assert relative_error(torch.cat(dks, 2), ref[2]) < 1e-12
    assert relative_error(torch.cat(dvs, 2), ref[3]) < 1e-12


@pytest.mark.parametrize("mask_name", ["causal", "causal_document", "global_sliding_window", "share_question"])
def test_flex_step_backward_equals_the_explicit_formulas(mask_name):
    # Naive.bwd writes out P = exp(S scale - L), dS = P (dP - rowsum(dO O)): the same share.
    q, k, v, do = _inputs(160, 160, seed=7)
    slices = build_mask(mask_name, 320).slices
    step = sl.shift_slices(sl.clip_slices(slices, 160, 320, 0, 160), -160, 0)  # queries 160-319, keys 0-159
    fx, nv = Flex(), Naive()
    sub, sub_n = fx.prepare(step, 160, 160, CPU), nv.prepare(step, 160, 160, CPU)
    g = torch.Generator().manual_seed(1)
    out = torch.randn(q.shape, generator=g, dtype=torch.float64)  # any combined out and LSE
    lse = nv.fwd(q, k, v, sub_n)[1] + torch.rand(q.shape[:3], generator=g, dtype=torch.float64)
    for got, want in zip(fx.bwd(do, q, k, v, out, lse, sub), nv.bwd(do, q, k, v, out, lse, sub_n)):
        assert relative_error(got, want) < 1e-12


def test_block_sparse_layout_with_gqa_matches_the_explicit_formulas():
    q, k, v, do = _inputs(64, 64, hq=4, hk=2)
    kept = np.zeros((2, 4, 4), dtype=bool)
    kept[0] = np.tril(np.ones((4, 4), dtype=bool))
    kept[1, :, 0] = kept[1, 2, 3] = True
    layout = BlockLayout(np.arange(0, 65, 16), np.arange(0, 65, 16), kept)
    fx, nv = Flex(), Naive()
    sub, sub_n = fx.prepare_blocks(layout, 4, CPU), nv.prepare_blocks(layout, 4, CPU)
    out, lse = nv.fwd(q, k, v, sub_n)
    for got, want in zip(fx.bwd(do, q, k, v, out, lse, sub), nv.bwd(do, q, k, v, out, lse, sub_n)):
        assert relative_error(got, want) < 1e-12


def _parts(q, k, v, out, lse, bm):
    mask_fn, bufs = fb._mask_fn_and_buffers(bm.mask_mod)
    block_tuple = bm.as_tuple()
    options = fb._kernel_options(q, k, v)
    f = fb._backward_fn(block_tuple, mask_fn, 0.25, options, *fb._graphs(q))
    lse2 = lse / fb.LN2 if fb._lse_is_log2(options) else lse
    args = (q, k, v, out, lse2, *bufs, *fb._block_tensors(block_tuple))
    return f, args


def test_the_graph_compiled_on_cuda_takes_every_tensor_as_input_and_computes_the_same():
    q, k, v, do = _inputs(40, 56, d=16)
    slices = _every_kind()
    fx = Flex()
    sub = fx.prepare(slices, 40, 56, CPU)
    out, lse = fx.fwd(q, k, v, sub)
    f, args = _parts(q, k, v, out, lse, sub.form)
    args = args[:5] + (do,) + args[5:]
    gm = fb.trace(f, args)
    # interval tables and BlockMask indices are graph inputs, not constants baked into the graph
    assert not [n for n in gm.graph.nodes if n.op == "get_attr" and "constant" in str(n.target)]
    assert sum(n.op == "placeholder" for n in gm.graph.nodes) == len(args)
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert any("flex_attention_backward" in t for t in targets)
    for got, want in zip(gm(*args), f(*args)):
        assert torch.equal(got, want)
    for got, want in zip(gm(*args), reference_attention(q, k, v, slices, do)[1:]):
        assert relative_error(got, want) < 1e-12


def test_a_mask_mod_capturing_tensors_without_explicit_buffers_is_refused():
    from torch.nn.attention.flex_attention import create_block_mask

    lo = torch.zeros(128, dtype=torch.int64)
    bm = create_block_mask(lambda b, h, qi, ki: ki >= lo[qi], 1, 1, 128, 128, device="cpu")
    q, k, v, do = _inputs(128, 128)
    with pytest.raises(ValueError, match="captures tensors.*with_buffers"):
        fb.flex_backward(do, q, k, v, q, torch.zeros(q.shape[:3], dtype=torch.float64), bm)


def test_graphs_are_told_apart_by_what_the_mask_function_bakes_in():
    # One interval layer and two (global_sliding_window) trace different mask graphs: cache keys differ.
    one = to_block_mask(build_mask("causal", 256), device="cpu").mask_mod
    two = to_block_mask(build_mask("global_sliding_window", 256), device="cpu").mask_mod
    assert len(one.buffers) == 2 and len(two.buffers) == 4
    assert fb._closure_constants(one.with_buffers) != fb._closure_constants(two.with_buffers)
    m = Mask("m", 64, 64, build_mask("causal", 64).slices)
    assert fb._closure_constants(to_block_mask(m).mask_mod.with_buffers) == fb._closure_constants(one.with_buffers)


def test_the_cache_key_sees_which_block_mask_entries_are_tensors():
    t = torch.zeros(2)
    assert fb._signature((8, t, None, max), ()) != fb._signature((8, None, t, max), ())
    assert fb._signature((8, t, None, max), ()) == fb._signature((8, torch.ones(2), None, min), ())

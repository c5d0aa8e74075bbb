"""The host-side LRU of reference tensors: byte budget, gradients on demand, copies not views."""

import torch

from longca.measure.reference_cache import ReferenceCache, default_budget_bytes


def _entry(n: int, grads: bool = True) -> dict[str, torch.Tensor]:
    t = {"out": torch.ones(n)}
    if grads:
        t.update(dq=torch.ones(n), dk=torch.ones(n), dv=torch.ones(n))
    return t


def test_least_recently_used_entries_leave_past_the_byte_budget():
    cache = ReferenceCache(max_bytes=3 * 4 * 4 * 10)  # three entries of 4 tensors x 10 float32
    for key in "abc":
        cache.put(key, _entry(10))
    assert cache.get("a", True, torch.device("cpu")) is not None  # a is now the most recent
    cache.put("d", _entry(10))
    assert len(cache) == 3 and cache.bytes == 3 * 160
    assert cache.get("b", True, torch.device("cpu")) is None  # b was the least recently used
    assert all(cache.get(k, True, torch.device("cpu")) is not None for k in "acd")


def test_an_entry_without_gradients_does_not_answer_a_gradient_check():
    cache = ReferenceCache(max_bytes=1 << 20)
    cache.put("k", _entry(8, grads=False))
    assert cache.get("k", False, torch.device("cpu"))["out"].shape == (8,)
    assert cache.get("k", True, torch.device("cpu")) is None
    cache.put("k", _entry(8))  # replaced, not counted twice
    assert cache.get("k", True, torch.device("cpu")) is not None and cache.bytes == 4 * 32


def test_oversize_entries_are_not_kept_and_stored_tensors_are_copies():
    cache = ReferenceCache(max_bytes=100)
    cache.put("big", _entry(100))
    assert len(cache) == 0 and cache.bytes == 0
    x = torch.zeros(4, requires_grad=True)
    cache.put("x", {"out": x * 1})
    got = cache.get("x", False, torch.device("cpu"))["out"]
    got += 1
    assert not got.requires_grad and cache.get("x", False, torch.device("cpu"))["out"].sum() == 0


def test_default_budget_is_bounded():
    assert 0 < default_budget_bytes() <= 32 << 30

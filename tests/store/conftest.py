import sys

import pytest

from longca.store.aggregate import aggregate


@pytest.fixture(params=["polars", "pyarrow"])
def union(request, monkeypatch):
    """`aggregate` as it runs here (Polars) and on a host without Polars (the GPU hosts: pyarrow)."""
    if request.param == "pyarrow":
        monkeypatch.setitem(sys.modules, "polars", None)  # `import polars` now raises ImportError
    return aggregate

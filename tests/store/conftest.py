import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # sibling helper modules (pytest runs in importlib mode)

from longca.store.aggregate import aggregate


@pytest.fixture(params=["polars", "pyarrow"])
def union(request, monkeypatch):
    """`aggregate` as it runs here (Polars) and on a host without Polars (the GPU hosts: pyarrow)."""
    if request.param == "pyarrow":
        monkeypatch.setitem(sys.modules, "polars", None)  # `import polars` now raises ImportError
    return aggregate

import os
import shutil
import sys
from pathlib import Path

# Without an NVIDIA GPU, Triton kernels run through Triton's interpreter. The switch is read when
# triton is first imported, and other tests (fla, flex) import it early: set it before anything.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "tests" / "plugins"


@pytest.fixture
def plugin_env(monkeypatch):
    """Register the deliberately broken kernels (tests only) in this process and in workers."""
    monkeypatch.setenv("LONGCA_PLUGINS", "faulty_kernels")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]))
    if str(PLUGINS) not in sys.path:
        sys.path.insert(0, str(PLUGINS))
    import longca.kernels.registry as reg
    import faulty_kernels  # noqa: F401  registers on import

    yield
    for name in list(reg.KERNELS):
        if name.startswith("test_"):
            del reg.KERNELS[name]
    sys.modules.pop("faulty_kernels", None)

"""Kernel adapters by name. Every module in longca.kernels.adapters registers its kernels on import,
so adding a kernel is adding one module (no list to edit)."""

from __future__ import annotations

import importlib
import os
import pkgutil

from longca.kernels.base import Kernel

KERNELS: dict[str, Kernel] = {}
_loaded = False


def register(kernel: Kernel) -> Kernel:
    if kernel.name in KERNELS:
        raise ValueError(f"kernel {kernel.name!r} registered twice")
    KERNELS[kernel.name] = kernel
    return kernel


def load_plugins() -> None:
    """Kernels outside the package (a user's own adapter, or tests' deliberately broken ones):
    LONGCA_PLUGINS=module[,module...], importable from PYTHONPATH, each registering on import."""
    for name in filter(None, (m.strip() for m in os.environ.get("LONGCA_PLUGINS", "").split(","))):
        importlib.import_module(name)


def load_all() -> dict[str, Kernel]:
    """Import every adapter module once. Adapters must import optional packages lazily."""
    global _loaded
    if not _loaded:
        import longca.kernels.adapters as pkg

        for mod in sorted(m.name for m in pkgutil.iter_modules(pkg.__path__)):
            importlib.import_module(f"{pkg.__name__}.{mod}")
        load_plugins()
        _loaded = True
    return KERNELS


def get(name: str) -> Kernel:
    kernels = load_all()
    if name not in kernels:
        raise KeyError(f"unknown kernel {name!r}; allowed: {sorted(kernels)}")
    return kernels[name]

"""Kernel adapters by name. Every module in longca.kernels.adapters registers its kernels on import,
so adding a kernel is adding one module (no list to edit)."""

from __future__ import annotations

import importlib
import os
import pkgutil

from longca.kernels.base import Kernel, Unsupported

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


def rank_kernel_names() -> list[str]:
    """The kernels that can be context-parallel per-rank kernels (their `caps.cp` is set)."""
    return sorted(name for name, k in load_all().items() if k.caps.cp is not None)


def rank_kernel(name: str):
    """A fresh per-rank kernel object (longca.kernels.rank) of the kernel `name`; Unsupported naming
    the kernels that can serve when this one cannot."""
    kernel = get(name)
    if kernel.caps.cp is None:
        raise Unsupported(
            f"kernel {name!r} cannot be a context-parallel per-rank kernel (it returns no LSE or "
            f"its backward takes no combined output and LSE); allowed: {rank_kernel_names()}"
        )
    return kernel.rank_kernel()

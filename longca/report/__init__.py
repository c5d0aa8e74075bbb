"""The static report: aggregation queries, Altair charts, peer overlays, pages, exports.

Entry point: build_report(data, out, spec=None, title=None), also `longca report`. Imported lazily so
the export worker processes (longca.report.render) start without Altair and Polars.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Built", "build_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from longca.report import build

        return getattr(build, name)
    raise AttributeError(name)

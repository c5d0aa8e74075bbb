"""Which longca functions spawned ranks ran, for the mutation score (README, Reliability).

mutmut maps each function to the tests that call it by recording calls in the test's own process;
the gloo ranks of the CP tests run in spawned processes, whose calls it never sees, so every
mechanism's mutants would count as untested. While mutmut collects (`MUTANT_UNDER_TEST=stats`), a
rank writes the functions it ran to a folder at its end and the test's process adds them to its own
record. Otherwise both are no-ops: mutated code itself runs in the ranks unchanged, since they inherit
the mutant's name from the environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _collecting() -> bool:
    return os.environ.get("MUTANT_UNDER_TEST") == "stats"


def save(folder: str | Path) -> None:
    """In a spawned rank, at its end: the functions it ran, to `folder`."""
    if not _collecting():
        return
    from mutmut.state import state

    Path(folder, f"rank-hits-{os.getpid()}.json").write_text(json.dumps(sorted(state()._stats)))


def merge(folder: str | Path) -> None:
    """In the test's process, after its ranks ended: their functions, as if it had run them."""
    if not _collecting():
        return
    from mutmut.state import state

    for path in Path(folder).glob("rank-hits-*.json"):
        state()._stats.update(json.loads(path.read_text()))

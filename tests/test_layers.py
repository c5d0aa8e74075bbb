"""The package's floors (docs/architecture.md): every longca import, at module level or inside a
function, points to the same floor or one below, so data flows one way and the ground floor
(longca.vocab) can be read without loading a kernel."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "longca"
FLOORS = {
    "vocab": 0,
    "masks": 1,
    "measure": 2,
    "kernels": 3,
    "cp": 4,
    "spec": 5,
    "store": 6,
    "run": 7,
    "model": 8,
    "report": 8,
    "commands": 9,
    "cli": 9,
    "__init__": 0,
    "data": 0,
}


def floor(module: str) -> int:
    """The floor of a dotted module name under longca ('longca' itself is the root, floor 0)."""
    parts = module.split(".")
    return FLOORS[parts[1]] if len(parts) > 1 else 0


def imports() -> list[tuple[str, str, int]]:
    """(importing module, imported longca module, line) for every import in the package."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        me = ".".join(rel.parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                target = next((t for t in reversed(targets) if _exists(t)), node.module)
                if target.startswith("longca"):
                    found.append((me, target, node.lineno))
            elif isinstance(node, ast.Import):
                found += [(me, a.name, node.lineno) for a in node.names if a.name.startswith("longca")]
    return found


def _exists(module: str) -> bool:
    rel = Path(*module.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").is_file() or (PACKAGE.parent / rel / "__init__.py").is_file()


def test_no_import_runs_up_a_floor():
    upward = [(me, target, line) for me, target, line in imports() if me != "longca" and floor(target) > floor(me)]
    assert upward == []


def test_the_ground_floor_imports_nothing_of_longca_nor_torch():
    tree = ast.parse((PACKAGE / "vocab.py").read_text(encoding="utf-8"))
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [n.module if isinstance(n, ast.ImportFrom) else n.names[0].name for n in top_level]
    assert not [n for n in names if n and (n.startswith("longca") or n.startswith("torch"))]


def test_every_package_has_a_floor():
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert subpackages | modules <= set(FLOORS)


def test_the_scan_sees_imports_inside_functions_and_would_name_an_upward_one():
    found = imports()
    # the per-rank Flex builds its BlockMask lazily (longca.masks.flex inside a method)
    assert any(a == "longca.kernels.adapters.flex" and b == "longca.masks.flex" for a, b, _ in found)
    assert floor("longca.run.rows") > floor("longca.kernels.base")  # what an upward import would compare


def _module(target: str) -> str:
    """The module an import names ('longca.a.b.Name' -> 'longca.a.b')."""
    while target and not _exists(target):
        target = target.rpartition(".")[0]
    return target


def import_cycles(found: list[tuple[str, str, int]]) -> list[list[str]]:
    """Every set of longca modules that import one another in a loop, at module level or inside
    functions (strongly connected components of the import graph, Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for me, target, _ in found:
        graph.setdefault(me, set()).add(_module(target))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_loop():
    assert import_cycles(imports()) == []


def test_the_loop_finder_would_name_a_loop():
    # spec.cells imports vocab; vocab importing spec.cells back closes a loop of the two
    looped = imports() + [("longca.vocab", "longca.spec.cells.Cell", 1)]
    assert any({"longca.spec.cells", "longca.vocab"} <= set(c) for c in import_cycles(looped))

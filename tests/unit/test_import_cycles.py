"""No two modules import each other, not even for type checking only (issue 49): a circle hidden
behind `if TYPE_CHECKING:` still ties the modules together, and neither can be read alone."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("backfill", "activities", "workflows", "api", "worker", "tools")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The modules `path` imports at module level, `if TYPE_CHECKING:` blocks included
    (imports inside functions run late and are left out). `known` holds the modules, not the
    packages: a package's `__init__` re-exporting its modules is issue 49's other rule (no
    re-export module), not a circle between two modules."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    todo: list[ast.stmt] = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.If, ast.Try)):
            todo.extend(node.body + node.orelse)
            todo.extend(s for h in getattr(node, "handlers", []) for s in h.body)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m in known and m != module}


def _graph() -> dict[str, set[str]]:
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    known = {_module(p) for p in paths if p.name != "__init__.py"}
    return {_module(p): _imports(p, known) for p in paths}


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part: set[str] = set()
            while True:
                w = stack.pop()
                on.discard(w)
                part.add(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(frozenset(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_under_type_checking() -> None:
    """The check reads imports under `if TYPE_CHECKING:` (tools.sim.stats imports the GPU
    engine there only)."""
    assert "tools.sim.gpu" in _graph()["tools.sim.stats"]


def test_no_module_imports_one_that_imports_it() -> None:
    circles = [sorted(c) for c in _circles(_graph())]
    assert circles == []

"""The one-way house (issue 11; ADR 0013), read from the code's own imports with ``ast``.

Every ``import`` and ``from … import`` in the portal's four apps and the Flower App, at module
level or inside a function, is an arrow. Checked: each app imports only the floors below it
(portal ← sandbox ← federation ← accounting), the Flower App (``federation/flwr_app``) imports no
Django and nothing of the portal but the site-side sandbox modules, and no module reaches itself
through the arrows (no circle, Tarjan's strongly connected components). Tests, migrations and
the demo seeding (above all four apps) are not part of the picture.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOORS = {"portal": 0, "sandbox": 1, "federation": 2, "accounting": 3}
APP = ROOT / "federation" / "flwr_app"


def _modules() -> dict[str, Path]:
    out = {}
    for app in FLOORS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts or APP in path.parents:
                continue
            out[".".join(path.relative_to(ROOT).with_suffix("").parts)] = path
    for path in (APP / "frp_flwr").rglob("*.py"):
        out[".".join(path.relative_to(APP).with_suffix("").parts)] = path
    return {name.removesuffix(".__init__"): path for name, path in out.items()}


def _imports(name: str, path: Path) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(name, path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _raw_imports() -> dict[str, set[str]]:
    return {name: _imports(name, path) for name, path in _modules().items()}


def test_each_app_imports_only_the_floors_below_it():
    graph = _graph()
    # The arrows are read: every upper app builds on the floor.
    for app in ("sandbox", "federation", "accounting"):
        assert any(
            t.startswith("portal") for n, ts in graph.items() if n.startswith(app) for t in ts
        ), app
    wrong = []
    for name, targets in graph.items():
        top = name.split(".")[0]
        if top not in FLOORS:
            continue
        for target in targets:
            other = target.split(".")[0]
            if other in FLOORS and FLOORS[other] > FLOORS[top]:
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_the_flower_app_imports_no_django_and_of_the_apps_only_sandbox():
    wrong = []
    for name, imported in _raw_imports().items():
        if not name.startswith("frp_flwr"):
            continue
        for target in imported:
            top = target.split(".")[0]
            if top in ("django", "portal", "federation", "accounting", "demo"):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_no_module_reaches_itself():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:  # Tarjan (1972), recursive: the graph is a few hundred nodes
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []

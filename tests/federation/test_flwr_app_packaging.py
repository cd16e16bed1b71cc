"""The Flower App's ``pyproject.toml`` declares every package its code imports (issue 11, point 5).

The import statements of ``frp_flwr/*.py`` are read with ``ast`` and followed through every
first-party module they reach outside the app (the site-side sandbox modules the ClientApp loads
its data with); each third-party top-level module is mapped to its distribution by
``importlib.metadata.packages_distributions`` (the installed packages' own records).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
APP = ROOT / "federation" / "flwr_app"
FIRST_PARTY = {"frp_flwr": APP, "sandbox": ROOT, "portal": ROOT, "federation": ROOT}


def _module_file(name: str) -> Path | None:
    """The source file of first-party module ``name`` (a package's ``__init__.py``), or None."""
    base = FIRST_PARTY[name.split(".")[0]] / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, name: str) -> set[str]:
    """Dotted names ``path`` (module ``name``) imports, with ``from a import b`` as ``a.b`` too."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{parent}.{module}".strip(".")
            out.add(module)
            out.update(f"{module}.{alias.name}" for alias in node.names)
    return out


def _reached() -> tuple[set[str], set[str]]:
    """``(first-party modules, third-party top-level names)`` the Flower App's code reaches."""
    todo = [f"frp_flwr.{p.stem}" for p in (APP / "frp_flwr").glob("*.py")]
    seen: set[str] = set()
    third: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:  # ``from package import function``: not a module
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parents run first
        for imported in _imports(path, name):
            top = imported.split(".")[0]
            if top in FIRST_PARTY or top in ("accounting", "demo"):
                todo.append(imported)
            elif top not in sys.stdlib_module_names:
                third.add(top)
    return seen, third


def _declared() -> set[str]:
    project = tomllib.loads((APP / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    return {_canonical(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in requirements}


def _canonical(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def test_every_third_party_import_is_declared():
    _, third = _reached()
    dists = importlib.metadata.packages_distributions()
    needed = {top: {_canonical(d) for d in dists.get(top, [top])} for top in third}

    undeclared = {top: d for top, d in needed.items() if not d & _declared()}

    assert {"flwr", "numpy", "cryptography", "minio", "pyarrow"} <= set(needed)
    assert not undeclared, undeclared


def test_the_app_reaches_no_django_and_only_site_side_modules():
    first, third = _reached()

    assert "django" not in third and "allauth" not in third and "celery" not in third
    outside = {m for m in first if not m.startswith("frp_flwr")}
    assert {m.split(".")[0] for m in outside} == {"sandbox"}
    assert "sandbox.loader" in outside and "sandbox.keyring" in outside
    assert not outside & {"sandbox.models", "sandbox.services", "sandbox.sitestore"}

"""The site wheel's declared dependencies cover the Flower App's (no integration: files only).

A SuperNode runs the ClientApp from the site wheel, so every requirement of the Flower App
(``federation/flwr_app/pyproject.toml``, its dependencies and its optional extras) must be declared
by the wheel (``scripts/build_site_wheel.py``'s ``DEPENDENCIES``), with every version clause the
App states: the wheel may narrow a range, never drop a bound or a pin.
"""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]


def _wheel_dependencies() -> dict[str, Requirement]:
    spec = importlib.util.spec_from_file_location(
        "build_site_wheel", ROOT / "scripts" / "build_site_wheel.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reqs = [Requirement(d) for d in module.DEPENDENCIES]
    return {canonicalize_name(r.name): r for r in reqs}


def _app_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "federation/flwr_app/pyproject.toml").read_text())["project"]
    deps = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        deps.extend(extra)
    return [Requirement(d) for d in deps]


def test_wheel_declares_every_flower_app_requirement_with_its_bounds():
    wheel = _wheel_dependencies()
    app = _app_requirements()
    assert app, "the Flower App declares no dependencies"
    for req in app:
        name = canonicalize_name(req.name)
        assert name in wheel, f"site wheel lacks {req} (Flower App dependency)"
        missing = {str(s) for s in req.specifier} - {str(s) for s in wheel[name].specifier}
        assert not missing, f"site wheel's {wheel[name]} drops {sorted(missing)} of the App's {req}"


def test_xgboost_pinned_as_the_flower_app_pins_it():
    # The tree model (frp_flwr.trees) imports xgboost at the site; pinned == in the App.
    assert str(_wheel_dependencies()["xgboost-cpu"].specifier) == "==3.2.0"

"""Build the site package's wheel (``frp-site``) from this repository: what a site installs.

    python scripts/build_site_wheel.py [OUT_DIR]      # default: dist/

The wheel holds no Django and nothing of the portal: ``frp_site`` (the ``frp-site`` tool), the
Flower App ``frp_flwr`` (the ClientApp a SuperNode runs) and the sandbox's site-side modules
(``SITE_MODULES``: crypto, keyring, storage, ingest, loader, profile, csvformat, arrowcsv). Its
dependencies are the ClientApp's and the site tool's (``DEPENDENCIES``): every requirement of the
Flower App's ``pyproject.toml``, with its bounds (``tests/frp_site/test_wheel_dependencies.py``). The files are copied into
a staging folder with a ``pyproject.toml`` of their own and built by setuptools (``pip wheel``,
which fetches setuptools and wheel into an isolated build environment). ``tests/frp_site/test_wheel.py`` checks that
every module of the wheel imports without Django. Prints the wheel's path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE_MODULES = (
    "__init__",
    "arrowcsv",
    "crypto",
    "csvformat",
    "ingest",
    "keyring",
    "loader",
    "profile",
    "storage",
)
DEPENDENCIES = (
    "flwr==1.42.0",
    "numpy>=1.26,<3",
    "cryptography>=43",
    "pyarrow>=16,<27",
    "minio>=7.2,<8",
    "urllib3>=1.26,<3",
    "certifi",
    # Gradient-boosted trees (frp_flwr.trees): the same pin as federation/flwr_app/pyproject.toml.
    "xgboost-cpu==3.2.0",
)


def _version() -> str:
    sys.path.insert(0, str(ROOT))
    from frp_site import __version__

    return __version__


PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "frp-site"
version = "{version}"
description = "Federated Research Portal, the site package: SuperNode launch, ClientApp, site sandbox, frp-site tool (no Django)."
requires-python = ">=3.11,<3.12"
dependencies = [{dependencies}]

[project.scripts]
frp-site = "frp_site.cli:main"

[tool.setuptools]
packages = ["frp_site", "frp_flwr", "sandbox"]

[tool.setuptools.package-data]
frp_flwr = ["py.typed"]
"""


def stage(into: Path) -> Path:
    """Copy the wheel's sources into ``into``; return it."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "frp_site", into / "frp_site", ignore=ignore)
    shutil.copytree(ROOT / "federation" / "flwr_app" / "frp_flwr", into / "frp_flwr", ignore=ignore)
    (into / "sandbox").mkdir()
    for name in SITE_MODULES:
        shutil.copy2(ROOT / "sandbox" / f"{name}.py", into / "sandbox" / f"{name}.py")
    (into / "pyproject.toml").write_text(
        PYPROJECT.format(version=_version(), dependencies=", ".join(f'"{d}"' for d in DEPENDENCIES))
    )
    return into


def build(out_dir: Path) -> Path:
    """Build the wheel into ``out_dir``; return its path. Raises ``RuntimeError`` on failure."""
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="frp-site-wheel-") as tmp:
        src = stage(Path(tmp) / "src")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--quiet",
                "--wheel-dir",
                str(out_dir),
                str(src),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"building the site wheel failed:\n{proc.stdout}\n{proc.stderr}")
    wheels = sorted(out_dir.glob(f"frp_site-{_version()}-*.whl"))
    if not wheels:
        raise RuntimeError(f"no wheel was written to {out_dir}")
    return wheels[-1]


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "dist"))

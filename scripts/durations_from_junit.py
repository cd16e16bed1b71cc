"""Write ``tests/durations.json`` (seconds per slow test file) from a pytest JUnit XML report.

    .venv/bin/python -m pytest ... --junitxml=/tmp/junit.xml   # e.g. PYTEST_ADDOPTS for .ci/run
    .venv/bin/python scripts/durations_from_junit.py /tmp/junit.xml > tests/durations.json

``tests/conftest.py`` hands out the slow files longest first under pytest-xdist. Only files of
more than ``--min`` seconds (default 30) are kept: the order of the quick ones does not matter.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def durations(path: str, minimum: float) -> dict[str, float]:
    """File path (relative to the repository, as ``tests/...py``) → summed seconds of its tests."""
    totals: dict[str, float] = defaultdict(float)
    # our own pytest report, not untrusted input
    for case in ET.parse(path).iter("testcase"):  # noqa: S314
        module = case.get("classname", "")
        parts = module.split(".")
        # classname is the dotted module, plus a class name for tests in a class
        while parts and not parts[-1].startswith("test_"):
            parts.pop()
        if parts:
            totals["/".join(parts) + ".py"] += float(case.get("time") or 0.0)
    return {f: round(s, 1) for f, s in sorted(totals.items(), key=lambda kv: -kv[1]) if s > minimum}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit")
    parser.add_argument("--min", type=float, default=30.0)
    args = parser.parse_args()
    json.dump(durations(args.junit, args.min), sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

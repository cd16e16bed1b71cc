"""The order slow test files are handed out in under pytest-xdist (tests/conftest.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests import conftest

ROOT = Path(conftest.__file__).resolve().parent.parent


@dataclass
class _Item:
    path: Path
    slow: bool

    def get_closest_marker(self, name):
        return object() if (name == "slow" and self.slow) else None


def test_slow_files_go_first_longest_first_and_each_file_stays_together(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    measured = json.loads((ROOT / "tests" / "durations.json").read_text())
    longest, shorter = list(measured)[:2]  # the file lists the longest first
    assert measured[longest] >= measured[shorter]
    unlisted = ROOT / "tests" / "federation" / "test_not_measured_yet.py"
    quick = ROOT / "tests" / "portal" / "test_quick.py"
    items = [
        _Item(quick, False),
        _Item(ROOT / shorter, True),
        _Item(ROOT / shorter, True),
        _Item(unlisted, True),
        _Item(ROOT / longest, True),
        _Item(quick, False),
    ]

    conftest.pytest_collection_modifyitems(None, items)

    order = [i.path for i in items]
    assert order[:3] == [ROOT / longest, ROOT / shorter, ROOT / shorter]
    assert order[3] == unlisted  # an unmeasured slow file counts as the median: after these two
    assert order[4:] == [quick, quick]


def test_without_xdist_the_order_is_left_alone(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    items = [_Item(ROOT / "a.py", False), _Item(ROOT / "b.py", True)]

    conftest.pytest_collection_modifyitems(None, items)

    assert [i.path.name for i in items] == ["a.py", "b.py"]

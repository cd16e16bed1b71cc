"""One typing rule for a CSV column (issue 11, point 7): ingest's profile (``ColumnStats``, batch
by batch, on strings) and the loader's untyped parse (``loader.parse_table``, all values at once)
give every column the same type, because both ask ``csvformat.infer_kind``. The independent
source is the rule as the module doc of ``csvformat`` states it, cell by cell
(``classify_value`` widened over the column)."""

from __future__ import annotations

import csv
import io

from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.csvformat import DEFAULT_MISSING_VALUES, classify_value, widen
from sandbox.loader import parse_table
from sandbox.profile import ColumnStats

CELLS = st.sampled_from(
    ["1", "-7", "2.5", "1e3", "", "NA", "true", "FALSE", "2024-02-29", "2023-02-29", "x", " 3 "]
)


def _by_hand(cells: list[str]) -> str:
    kind = None
    for cell in cells:
        seen = classify_value(cell, DEFAULT_MISSING_VALUES)
        if seen is not None:
            kind = widen(kind, seen)
    return kind or "str"


@settings(max_examples=300, deadline=None)
@given(st.lists(CELLS, min_size=1, max_size=30), st.integers(1, 7))
def test_profile_and_loader_type_a_column_alike(cells, batch):
    stats = ColumnStats(name="c")
    for start in range(0, len(cells), batch):
        stats.add_batch(cells[start : start + batch], frozenset(DEFAULT_MISSING_VALUES))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["c"])
    writer.writerows([c] for c in cells)
    table = parse_table(out.getvalue())
    assert stats.final_type == table.types["c"] == _by_hand(cells)

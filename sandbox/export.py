"""CSV the portal lets users download, neutralised against formula injection (imports no Django).

Owns how any CSV leaving the portal is written, so that opening it in a spreadsheet cannot run a
formula planted in the data ("CSV injection", OWASP: https://owasp.org/www-community/attacks/
CSV_Injection). Following OWASP's guidance, a text cell that starts with ``=``, ``+``, ``-``,
``@``, a tab (0x09) or a carriage return (0x0D) is prefixed with a single quote ``'``, which
spreadsheets show but do not evaluate; cells are then quoted and embedded double quotes doubled
by the ``csv`` module (RFC 4180), so a cell cannot break out of its field either.

Numbers (``int``, ``float``, ``Decimal``; not ``bool``) are written as they are — ``-5`` is a
number, not a formula — and ``None`` as an empty cell. Everything else is converted with
``str()`` and neutralised. Export views use ``csv_lines`` with a streaming response or
``write_csv`` with any text stream.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import TextIO

FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")
PREFIX = "'"


def neutralise_cell(value: object) -> str | int | float | Decimal:
    """The value to write for one cell: numbers unchanged, ``None`` → ``""``, any other value
    as ``str`` with ``'`` prepended when it starts with one of ``FORMULA_PREFIXES``."""
    if value is None:
        return ""
    if isinstance(value, int | float | Decimal) and not isinstance(value, bool):
        return value
    text = str(value)
    return PREFIX + text if text.startswith(FORMULA_PREFIXES) else text


def neutralise_row(row: Iterable[object]) -> list[str | int | float | Decimal]:
    """``neutralise_cell`` applied to every cell of ``row``."""
    return [neutralise_cell(value) for value in row]


def write_csv(
    out: TextIO,
    rows: Iterable[Iterable[object]],
    *,
    header: Iterable[object] | None = None,
    delimiter: str = ",",
) -> int:
    """Write ``header`` (if given) and ``rows`` to ``out`` as neutralised CSV; return the number
    of data rows written. ``out`` should be opened with ``newline=""``; lines end in ``\\r\\n``
    (RFC 4180). The header is neutralised too (column names come from uploaded files)."""
    writer = csv.writer(out, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)
    if header is not None:
        writer.writerow(neutralise_row(header))
    count = 0
    for row in rows:
        writer.writerow(neutralise_row(row))
        count += 1
    return count


def csv_lines(
    rows: Iterable[Iterable[object]],
    *,
    header: Iterable[object] | None = None,
    delimiter: str = ",",
) -> Iterator[str]:
    """Yield the neutralised CSV one line (``str`` ending in ``\\r\\n``) at a time, for a
    streaming HTTP response; memory is one row."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)

    def take() -> str:
        line = buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
        return line

    if header is not None:
        writer.writerow(neutralise_row(header))
        yield take()
    for row in rows:
        writer.writerow(neutralise_row(row))
        yield take()

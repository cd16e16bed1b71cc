"""Tests for sandbox.export: downloaded CSV cannot carry a spreadsheet formula."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest

from sandbox.export import csv_lines, neutralise_cell, write_csv


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('=HYPERLINK("http://evil","x")', '\'=HYPERLINK("http://evil","x")'),
        ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("@SUM(A1:A2)", "'@SUM(A1:A2)"),
        ("\t=1+1", "'\t=1+1"),
        ("\r=1+1", "'\r=1+1"),
        ("plain", "plain"),
        ("a=b", "a=b"),
        (" =1", " =1"),
        ("", ""),
        (None, ""),
        (-5, -5),
        (2.5, 2.5),
        (Decimal("-1.20"), Decimal("-1.20")),
        (True, "True"),
    ],
)
def test_neutralise_cell(value, expected):
    assert neutralise_cell(value) == expected


def test_write_csv_neutralises_header_and_cells_and_quotes():
    out = io.StringIO(newline="")

    count = write_csv(
        out,
        [["=1+1", 'say "hi", then', -3], ["@x", "ok", None]],
        header=["name", "-note", "n"],
    )

    assert count == 2
    text = out.getvalue()
    assert text == ('name,\'-note,n\r\n\'=1+1,"say ""hi"", then",-3\r\n\'@x,ok,\r\n')
    parsed = list(csv.reader(io.StringIO(text, newline="")))
    assert [cell for row in parsed for cell in row if cell[:1] in "=+-@\t\r" and cell] == ["-3"]


def test_csv_lines_streams_one_line_per_row():
    lines = list(csv_lines(iter([["+a"], ["b"]]), header=["h"], delimiter=";"))

    assert lines == ["h\r\n", "'+a\r\n", "b\r\n"]

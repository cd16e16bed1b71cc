"""Tests for real-world CSVs through sandbox.ingest and back through sandbox.loader.

Each case is a small file written by the test, ingested (encrypted into a filesystem store),
then loaded again; the assertions are the expected parse — values and types — and what the
ingest reports about how it read the file.
"""

from __future__ import annotations

import codecs
import csv
import io
import json

import numpy as np
import pytest

from sandbox.crypto import associated_data, decrypt_all, encrypt_stream
from sandbox.csvformat import (
    CsvError,
    RecordReader,
    classify_value,
    detect_delimiter,
    resolve_encoding,
    split_trailer,
    widen,
)
from sandbox.ingest import ColumnStats, IngestError, ingest_csv
from sandbox.loader import load_table
from sandbox.storage import FilesystemStore

IDS = {"site": "hospital-a", "dataset": "realworld", "version": 1}

# Text with characters outside ASCII (é, ü, Å, ö, €) and a quoted field holding the delimiter.
TEXT = 'name{d}city{d}score\r\nJosé{d}"Zürich{d} CH"{d}1.5\r\nÅsa{d}Malmö €{d}2\r\n'


@pytest.fixture
def store(tmp_path) -> FilesystemStore:
    return FilesystemStore(tmp_path / "store")


def _ingest(tmp_path, store, kek, data: bytes, **kw):
    src = tmp_path / "upload.csv"
    src.write_bytes(data)
    return ingest_csv(src, store=store, kek=kek, tmp_dir=tmp_path, **IDS, **kw)


def _roundtrip(tmp_path, store, kek, data: bytes, **kw):
    result = _ingest(tmp_path, store, kek, data, **kw)
    table = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)
    return result, table


def _values(table) -> dict[str, list]:
    out = {}
    for name in table.columns:
        values = table.data[name].tolist()
        out[name] = [None if isinstance(v, float) and np.isnan(v) else v for v in values]
    return out


def _payload(store, kek, result) -> bytes:
    aad = associated_data(**IDS)
    return decrypt_all(kek=kek, aad=aad, source=io.BytesIO(store.get_bytes(result.store_key)))


def _objects(store) -> list[str]:
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*") if p.is_file())


# --- encodings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "encoding", "source"),
    [
        (TEXT.format(d=",").encode("utf-8"), "utf-8", "detected"),
        (codecs.BOM_UTF8 + TEXT.format(d=",").encode("utf-8"), "utf-8-sig", "bom"),
        (TEXT.format(d=",").encode("cp1252"), "cp1252", "detected"),
        (TEXT.format(d=",").encode("utf-16"), "utf-16", "bom"),  # BOM + native order
        (codecs.BOM_UTF16_BE + TEXT.format(d=",").encode("utf-16-be"), "utf-16", "bom"),
        (codecs.BOM_UTF16_LE + TEXT.format(d=",").encode("utf-16-le"), "utf-16", "bom"),
    ],
    ids=["utf-8", "utf-8-bom", "cp1252", "utf-16", "utf-16-be-bom", "utf-16-le-bom"],
)
def test_encoding_is_detected_and_text_decoded(tmp_path, store, kek, data, encoding, source):
    result, table = _roundtrip(tmp_path, store, kek, data)

    assert (result.encoding, result.encoding_source) == (encoding, source)
    assert result.schema == [
        {"name": "name", "type": "str"},
        {"name": "city", "type": "str"},
        {"name": "score", "type": "float"},
    ]
    assert _values(table) == {
        "name": ["José", "Åsa"],
        "city": ["Zürich, CH", "Malmö €"],
        "score": [1.5, 2.0],
    }


def test_latin1_file_without_cp1252_only_characters_reads_as_cp1252(tmp_path, store, kek):
    data = "name,country\nJosé,ES\nFrançoise,FR\n".encode("latin-1")

    result, table = _roundtrip(tmp_path, store, kek, data)

    assert result.encoding == "cp1252"
    assert _values(table)["name"] == ["José", "Françoise"]


def test_declared_encoding_is_used_and_reported(tmp_path, store, kek):
    data = "name,n\nZoë,1\n".encode("utf-16-le")  # no BOM: cannot be detected

    result, table = _roundtrip(tmp_path, store, kek, data, encoding="utf-16-le")

    assert (result.encoding, result.encoding_source) == ("utf-16-le", "declared")
    assert _values(table) == {"name": ["Zoë"], "n": [1.0]}


def test_utf16_without_bom_must_be_declared(tmp_path, store, kek):
    data = "name,n\nZoë,1\n".encode("utf-16-le")

    with pytest.raises(IngestError, match="declare its encoding"):
        _ingest(tmp_path, store, kek, data)
    assert _objects(store) == []


def test_undefined_cp1252_byte_names_line_and_column(tmp_path, store, kek):
    data = "id,name\n1,José\n2,ab\x81c\n".encode("latin-1")

    with pytest.raises(IngestError) as info:
        _ingest(tmp_path, store, kek, data)

    assert str(info.value).startswith("line 3, column 'name': bytes that are not valid cp1252")
    assert _objects(store) == []


def test_unknown_encoding_name_is_refused(tmp_path, store, kek):
    with pytest.raises(IngestError, match="unknown encoding 'klingon'"):
        _ingest(tmp_path, store, kek, b"a\n1\n", encoding="klingon")


# --- delimiters ------------------------------------------------------------------------------------


@pytest.mark.parametrize("delimiter", [",", ";", "\t"], ids=["comma", "semicolon", "tab"])
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "detected"])
def test_delimiters(tmp_path, store, kek, delimiter, declared):
    data = TEXT.format(d=delimiter).encode("utf-8")
    kw = {"delimiter": delimiter} if declared else {}

    result, table = _roundtrip(tmp_path, store, kek, data, **kw)

    assert result.delimiter == delimiter
    assert result.delimiter_source == ("declared" if declared else "detected")
    assert _values(table)["city"] == [f"Zürich{delimiter} CH", "Malmö €"]
    assert _values(table)["score"] == [1.5, 2.0]


def test_semicolon_file_is_stored_as_canonical_comma_utf8_csv(tmp_path, store, kek):
    data = 'name;city\r\nJosé;"a, b"\r\n'.encode("cp1252")

    result = _ingest(tmp_path, store, kek, data)

    start, meta = split_trailer(_payload(store, kek, result))
    payload = _payload(store, kek, result)
    assert payload[:start] == 'name,city\nJosé,"a, b"\n'.encode()
    assert json.loads(meta)["columns"] == result.schema


def test_single_column_file_falls_back_to_comma(tmp_path, store, kek):
    result, table = _roundtrip(tmp_path, store, kek, b"value\n1\n2\n3\n")

    assert (result.delimiter, result.delimiter_source) == (",", "fallback")
    assert _values(table) == {"value": [1.0, 2.0, 3.0]}


def test_invalid_delimiter_is_refused(tmp_path, store, kek):
    with pytest.raises(IngestError, match="delimiter must be one of"):
        _ingest(tmp_path, store, kek, b"a|b\n1|2\n", delimiter="|")


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        # Excel's semicolon export: a quoted field holding ';' and a newline, at a CRLF line end
        # (csv.Sniffer alone answers "could not determine delimiter" here).
        ('id;country;score;note\r\n1;NA;3.5;"caf\xe9; open\nlate"\r\n2;FR;NA;plain\r\n', ";"),
        ('name,note\n"x; y",1\n"p;q",2\n', ","),  # the semicolons are inside quotes
        ('a\tb\tc\n"1,5"\t2\t3\n', "\t"),
        ("a;b;c\n1;2;3\n4;5", ";"),  # a sample cut inside its last row
    ],
)
def test_detect_delimiter_reads_quoted_fields(sample, expected):
    assert detect_delimiter(sample) == (expected, "detected")


def test_detect_delimiter_falls_back_to_comma_for_one_column():
    assert detect_delimiter("single\n1\n2\n") == (",", "fallback")


def test_detect_delimiter_and_resolve_encoding_units():
    assert detect_delimiter("a;b;c\n1;2;3\n4;5;6\n") == (";", "detected")
    assert detect_delimiter("a\tb\n1\t2\n") == ("\t", "detected")
    assert detect_delimiter("") == (",", "fallback")
    assert resolve_encoding(None, b"a,b\n") == ("utf-8", "detected")
    assert resolve_encoding("utf-8", codecs.BOM_UTF8 + b"a\n") == ("utf-8-sig", "declared")
    assert resolve_encoding("latin-1", b"a\n") == ("iso8859-1", "declared")
    with pytest.raises(CsvError):
        resolve_encoding("no-such-codec", b"")


# --- records ---------------------------------------------------------------------------------------


def test_quoted_field_with_embedded_newline_delimiter_and_quotes_crlf(tmp_path, store, kek):
    data = b'id,note,n\r\n1,"a, b\r\nc",2\r\n2,"say ""hi""",3\r\n\r\n3,plain,4\r\n'

    result, table = _roundtrip(tmp_path, store, kek, data)

    assert result.row_count == 3
    assert _values(table) == {
        "id": [1.0, 2.0, 3.0],
        "note": ["a, b\r\nc", 'say "hi"', "plain"],
        "n": [2.0, 3.0, 4.0],
    }


def test_ragged_row_names_the_physical_line_after_embedded_newlines(tmp_path, store, kek):
    # line 1 header; lines 2-4 one record with two embedded line breaks; line 5 blank; line 6 ok;
    # line 7 ragged.
    data = b'a,b\n1,"x\ny\nz"\n\n2,3\n4\n5,6\n'

    with pytest.raises(IngestError, match=r"^line 7: expected 2 fields, found 1$"):
        _ingest(tmp_path, store, kek, data)
    assert _objects(store) == []


def test_ragged_row_in_a_later_block_names_its_line(tmp_path, store, kek):
    pad = "x" * 100
    rows = [f"{i},{pad}" for i in range(20_000)]  # 2 MB: several blocks
    rows[15_000] = "oops"
    rows[3] = f'3,"{pad}\n{pad}"'  # one record on two lines, in the first block
    data = ("a,b\n" + "\n".join(rows) + "\n").encode()

    with pytest.raises(IngestError, match=r"^line 15003: expected 2 fields, found 1$"):
        _ingest(tmp_path, store, kek, data)


def test_unclosed_quote_names_the_line_where_the_field_starts(tmp_path, store, kek):
    data = b'a,b\n1,2\n3,"never closed\n4,5\n6,7\n'

    with pytest.raises(IngestError, match=r"^line 3: a quoted field is not closed"):
        _ingest(tmp_path, store, kek, data)


def test_stray_quote_names_the_line(tmp_path, store, kek):
    with pytest.raises(IngestError, match=r"^line 3: "):
        _ingest(tmp_path, store, kek, b'a,b\n1,2\n3,"x"y\n')


def _record_reader_rows(text: str, block_chars: int, delimiter: str = ","):
    reader = RecordReader(
        io.StringIO(text, newline=""), delimiter=delimiter, block_chars=block_chars
    )
    rows, lines = [], []
    for batch in reader.batches():
        rows += batch.rows
        lines += [batch.line_of(i) for i in range(len(batch.rows))]
    return reader.header, rows, lines


@pytest.mark.parametrize("block_chars", [1, 7, 40, 1 << 20])
def test_record_reader_matches_csv_module_across_blocks(block_chars):
    # Unquoted blocks take the str.split path, quoted ones csv.reader, and quoted fields run
    # across block ends at the small block sizes.
    text = (
        "h1,h2,h3\r\n"
        "1,plain,x\r\n"
        '2,"multi\r\nline, with comma",y\r\n'
        "\r\n"
        "3,,z\n"
        '4,"a ""quoted"" word",w\r'
        "5,tail,v\n"
        '6,"\n\n",u\n'
        "7,last,t"
    )
    expected = [row for row in csv.reader(io.StringIO(text, newline="")) if row][1:]

    header, rows, lines = _record_reader_rows(text, block_chars)

    assert header == ["h1", "h2", "h3"]
    assert rows == expected
    assert lines == [2, 3, 6, 7, 8, 9, 12]


@pytest.mark.parametrize("block_chars", [1, 12, 1 << 20])
def test_record_reader_unquoted_blocks_with_mixed_line_ends(block_chars):
    text = "a;b;c\r\n1;2;3\r4; 5;6\r\n\r\n7;8;\n9;10;11"
    expected = [row for row in csv.reader(io.StringIO(text, newline=""), delimiter=";") if row]

    header, rows, lines = _record_reader_rows(text, block_chars, delimiter=";")

    assert [header, *rows] == expected
    assert lines == [2, 3, 5, 6]


@pytest.mark.parametrize("block_chars", [12, 1 << 20])
def test_record_reader_short_and_long_row_do_not_cancel_out(block_chars):
    text = "a,b,c\n1,2,3\n4,5\n6,7,8,9\n"
    with pytest.raises(CsvError, match=r"^line 3: expected 3 fields, found 2$"):
        _record_reader_rows(text, block_chars)


def test_record_reader_single_column_blank_lines_and_whitespace():
    header, rows, lines = _record_reader_rows("v\n1\n\n \n2\n", 1 << 20)

    assert header == ["v"]
    assert rows == [["1"], [" "], ["2"]]  # a blank line is skipped, a space is a (missing) value
    assert lines == [2, 4, 5]


# --- missing values --------------------------------------------------------------------------------


def test_na_is_a_value_unless_declared(tmp_path, store, kek):
    data = b"country,count\nNA,1\nFR,\nDE,3\n"

    result, table = _roundtrip(tmp_path, store, kek, data)

    assert result.missing_values == ("",)
    assert result.schema == [
        {"name": "country", "type": "str"},
        {"name": "count", "type": "int"},
    ]
    assert _values(table) == {"country": ["NA", "FR", "DE"], "count": [1.0, None, 3.0]}


def test_declared_missing_markers(tmp_path, store, kek):
    data = b"country,count,score\nNA,1,-999\nFR,NA,2.5\n ,3,\n"

    result, table = _roundtrip(tmp_path, store, kek, data, missing_values=("", "NA", "-999"))

    assert result.missing_values == ("", "NA", "-999")
    assert [c["type"] for c in result.schema] == ["str", "int", "float"]
    assert _values(table) == {
        "country": [None, "FR", None],
        "count": [1.0, None, 3.0],
        "score": [None, 2.5, None],
    }
    columns = {c["name"]: c for c in result.profile["columns"]}
    assert columns["country"]["missing"] == "≤7"


def test_markers_that_look_like_numbers_and_padded_numbers(tmp_path, store, kek):
    data = b"x,y\n 1 ,inf\n2,-1\ninf,-999\n"

    result, table = _roundtrip(tmp_path, store, kek, data, missing_values=("inf", "-999"))

    assert [c["type"] for c in result.schema] == ["int", "int"]
    assert _values(table) == {"x": [1.0, 2.0, None], "y": [None, -1.0, None]}


def test_without_empty_marker_an_empty_cell_is_a_value(tmp_path, store, kek):
    data = b"code,n\n,1\nX,2\n"

    result, table = _roundtrip(tmp_path, store, kek, data, missing_values=("NA",))

    assert result.schema[0] == {"name": "code", "type": "str"}
    assert _values(table)["code"] == ["", "X"]


def test_missing_values_must_be_a_sequence(tmp_path, store, kek):
    with pytest.raises(IngestError, match="sequence of strings"):
        _ingest(tmp_path, store, kek, b"a\n1\n", missing_values="NA")


# --- types and overrides ---------------------------------------------------------------------------


def test_inferred_types_int_float_bool_date_str(tmp_path, store, kek):
    data = (
        b"id,dose,flag,seen,label,mixed\n"
        b"1,0.5,true,2024-01-31,a,1\n"
        b"2,1e2,FALSE,2023-12-01,b,true\n"
        b"3,,True,,c,2024-01-01\n"
    )

    result, table = _roundtrip(tmp_path, store, kek, data)

    assert [c["type"] for c in result.schema] == ["int", "float", "bool", "date", "str", "str"]
    values = _values(table)
    assert values["dose"] == [0.5, 100.0, None]
    assert values["flag"] == [True, False, True]
    assert table.data["seen"].dtype == np.dtype("datetime64[D]")
    assert str(table.data["seen"][0]) == "2024-01-31"
    assert np.isnat(table.data["seen"][2])
    assert values["mixed"] == ["1", "true", "2024-01-01"]
    assert table.numeric_columns() == ["id", "dose"]


TRICKY = [
    "1", "+1", "-1", " 1 ", "0001", "1.", ".5", "1e5", "1E+05", "-2.5e-3", "1e", "e5", "+-1",
    "1-2", "--1", ".", "-", "nan", "NaN", "inf", "-Infinity", "1_000", "١٢", "１", "0x10",
    "1.5.2", "1e400", "\x1c1", "1\t", "1 2", "1d", "true", "2024-01-01", "abc",
]  # fmt: skip


@pytest.mark.parametrize("value", TRICKY)
def test_batch_typing_agrees_with_classify_value(value):
    # The whole-batch fast paths (ingest and loader) must type every value exactly as the
    # per-value rule does, alone and inside a batch of plain integers.
    alone = ColumnStats(name="v")
    alone.add_batch([value])
    mixed = ColumnStats(name="v")
    mixed.add_batch(["1", "2", value, "3"])

    kind = classify_value(value)
    assert alone.final_type == kind
    assert mixed.final_type == widen("int", kind)


def test_invalid_dates_and_non_finite_numbers_are_text(tmp_path, store, kek):
    data = b"d,x\n2024-02-30,1e400\n2024-01-01,2\n"

    result = _ingest(tmp_path, store, kek, data)

    assert [c["type"] for c in result.schema] == ["str", "str"]


def test_schema_override_keeps_leading_zeros(tmp_path, store, kek):
    data = b"zip,n\n01234,1\n00501,2\n"

    result, table = _roundtrip(tmp_path, store, kek, data, schema_override={"zip": "str"})

    assert result.schema == [{"name": "zip", "type": "str"}, {"name": "n", "type": "int"}]
    assert _values(table)["zip"] == ["01234", "00501"]
    assert result.profile["columns"][0]["type_source"] == "override"
    assert result.profile["columns"][1]["type_source"] == "inferred"


def test_schema_override_float_accepts_integers(tmp_path, store, kek):
    result, table = _roundtrip(tmp_path, store, kek, b"x\n1\n2\n", schema_override={"x": "float"})

    assert result.schema == [{"name": "x", "type": "float"}]
    assert _values(table) == {"x": [1.0, 2.0]}


def test_schema_override_error_names_line_and_column(tmp_path, store, kek):
    data = b'id,age,note\n1,30,"two\nlines"\n2,41,x\n3,12.5,y\n4,50,z\n'

    with pytest.raises(IngestError) as info:
        _ingest(tmp_path, store, kek, data, schema_override={"age": "int"})

    assert str(info.value) == (
        "line 5, column 'age': value is not an integer (the column's declared type is 'int')"
    )
    assert "12.5" not in str(info.value)  # no data value in the message
    assert _objects(store) == []


def test_schema_override_error_in_a_later_block(tmp_path, store, kek):
    pad = "y" * 100
    rows = [f"{i},2024-01-01,{pad}" for i in range(20_000)]
    rows[12_345] = f"12345,2024-13-01,{pad}"
    data = ("id,day,pad\n" + "\n".join(rows) + "\n").encode()

    with pytest.raises(IngestError, match=r"^line 12347, column 'day': value is not a date"):
        _ingest(tmp_path, store, kek, data, schema_override={"day": "date"})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"nope": "int"}, r"not in the header: nope \(the header has: "),
        ({"a": "integer"}, "the type must be one of"),
    ],
)
def test_bad_schema_override_is_refused(tmp_path, store, kek, override, message):
    with pytest.raises(IngestError, match=message):
        _ingest(tmp_path, store, kek, b"a\n1\n", schema_override=override)


# --- profile ---------------------------------------------------------------------------------------


def test_profile_of_bool_and_date_columns(tmp_path, store, kek):
    lines = ["flag,day"]
    lines += [f"true,20{10 + i % 5}-01-0{1 + i % 9}" for i in range(12)]
    lines += ["FALSE,2019-06-01"] * 9 + ["false,"] * 3
    data = ("\n".join(lines) + "\n").encode()

    result = _ingest(tmp_path, store, kek, data)

    flag, day = result.profile["columns"]
    assert flag["type"] == "bool"
    assert flag["categories"] == [
        {"value": "false", "count": 10},
        {"value": "true", "count": 10},
    ]
    assert flag["other"] == 0
    assert day["type"] == "date"
    assert (day["min_year"], day["max_year"]) == (2010, 2019)
    assert day["missing"] == "≤7"
    assert result.profile["format"] == 2


# --- legacy objects --------------------------------------------------------------------------------


def test_object_stored_before_the_canonical_format_still_loads(tmp_path, store, kek):
    legacy = b"\xef\xbb\xbfid,flag,x\n1,true,\n2,false,2.5\n"
    sink = io.BytesIO()
    encrypt_stream(kek=kek, aad=associated_data(**IDS), source=io.BytesIO(legacy), sink=sink)
    blob = tmp_path / "legacy.enc"
    blob.write_bytes(sink.getvalue())
    store.put_file("hospital-a/realworld/v1.csv.enc", blob)

    table = load_table(store=store, kek=kek, store_key="hospital-a/realworld/v1.csv.enc", **IDS)

    assert table.types == {"id": "int", "flag": "str", "x": "float"}  # the rules of that time
    assert _values(table) == {"id": [1.0, 2.0], "flag": ["true", "false"], "x": [None, 2.5]}

"""The native (Arrow) CSV path gives what the pure-Python path gives, byte for byte.

Every case is ingested twice — ``native=True`` and ``native=False`` — with the same block size, so
both read the same blocks; the decrypted payloads (canonical CSV + trailer, ADR 0007), schemas,
row counts and profiles must be identical, and a bad file must fail with the same message. The
column statistics are also compared cell batch by cell batch on random strings.
"""

from __future__ import annotations

import codecs
import io
import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from benchmarks.sandbox import generate_csv
from sandbox import arrowcsv, ingest
from sandbox.crypto import associated_data, decrypt_all
from sandbox.csvformat import CellError, RecordReader
from sandbox.ingest import IngestError, ingest_csv
from sandbox.profile import ColumnStats
from sandbox.storage import FilesystemStore

TEXT = 'name{d}city{d}score\r\nJosé{d}"Zürich{d} CH"{d}1.5\r\nÅsa{d}Malmö €{d}2\r\n'


def _rows(n: int, d: str = ",", end: str = "\n") -> str:
    """Quote-free rows of every type: int, float, bool, date, text with spaces, a padded value."""
    lines = [d.join(["id", "x", "flag", "day", "region", "pad", "cc"])]
    for i in range(n):
        lines.append(
            d.join(
                [
                    str(i),
                    f"{(i * 7919) % 1000 / 8:.3f}",
                    "True" if i % 3 else "false",
                    f"2020-{1 + i % 12:02d}-{1 + i % 28:02d}",
                    ["North East", "Wales", "London"][i % 3],
                    f" {i % 50} ",
                    ["NA", "FR", "DE", ""][i % 4],
                ]
            )
        )
    return end.join(lines) + end


CASES = {
    "utf-8": (TEXT.format(d=",").encode("utf-8"), {}),
    "utf-8-bom": (codecs.BOM_UTF8 + TEXT.format(d=",").encode("utf-8"), {}),
    "cp1252": (TEXT.format(d=",").encode("cp1252"), {}),
    "utf-16": (TEXT.format(d=",").encode("utf-16"), {}),
    "utf-16-le-declared": ("name,n\nZoë,1\n".encode("utf-16-le"), {"encoding": "utf-16-le"}),
    "semicolon": (TEXT.format(d=";").encode("utf-8"), {}),
    "tab": (TEXT.format(d="\t").encode("utf-8"), {}),
    "rows-comma": (_rows(300).encode(), {}),
    "rows-semicolon-crlf": (_rows(300, ";", "\r\n").encode(), {}),
    "rows-tab-cr": (_rows(300, "\t", "\r").encode(), {"delimiter": "\t"}),
    "rows-cp1252": (_rows(300).replace("Wales", "Gwynedd é").encode("cp1252"), {}),
    "rows-utf-16": (_rows(300, ";").encode("utf-16"), {}),
    "na-declared": (_rows(300).encode(), {"missing_values": ("", "NA")}),
    "na-not-declared": (_rows(300).encode(), {"missing_values": ()}),
    "numeric-markers": (
        b"a,b\n" + b"".join(f"{i},{-999 if i % 5 == 0 else i / 4}\n".encode() for i in range(200)),
        {"missing_values": ("-999", "")},
    ),
    "blank-lines": (b"a,b\n\n1,2\n\r\n3,4\n\n\n5,6\n" * 20, {}),
    "single-column": (b"v\n1\n\n \n2\nx\n" * 30, {}),
    "semicolon-with-commas": (b"a;b\n1,5;x\n2,25;y\n" * 40, {}),
    "quotes-later": (_rows(100).encode() + b'7,1.5,true,2020-01-01,"a, b",3,FR\n', {}),
    "padded-and-nbsp": ("a,b\n 1 ,x\n\xa02\xa0,y\n3,\u3000z\n".encode() * 40, {}),
    "tricky-numbers": (
        (
            "a,b,c,d\n"
            + "".join(
                f"{v},{w},-0,+{i}\n"
                for i, (v, w) in enumerate(
                    [
                        ("1_000", "1e400"),
                        ("nan", "inf"),
                        ("٣", "1e5"),
                        ("0x10", ".5"),
                        ("5.", "-1E-3"),
                    ]
                    * 30
                )
            )
        ).encode(),
        {},
    ),
    "int-then-float-then-text": (
        b"a\n" + b"1\n" * 150 + b"2.5\n" * 150 + b"abc\n" * 150,
        {},
    ),
    "override": (
        _rows(300).encode(),
        {"schema_override": {"id": "str", "x": "float", "pad": "str", "day": "date"}},
    ),
    "dates-invalid": (b"d\n" + b"2020-02-29\n2021-02-29\n0000-01-01\n" * 40, {}),
    "whitespace-line-skipped": (b"a,b\n" + b"1,2\n" * 100 + b"   \n" + b"3,4\n", {}),
    "bools": (b"b\n" + b"TRUE\nfalse\nTrue\n" * 40, {}),
}

BAD = {
    "ragged-later": (_rows(200).encode() + b"1,2\n" + _rows(5).encode().split(b"\n", 1)[1], {}),
    "override-misfit": (_rows(200).encode(), {"schema_override": {"flag": "int"}}),
    "override-misfit-late": (
        b"a,b\n" + b"1,2\n" * 300 + b"3,x\n" + b"4,5\n" * 10,
        {"schema_override": {"b": "int"}},
    ),
    "stray-quote": (b"a,b\n" + b"1,2\n" * 100 + b'3,"x"y\n', {}),
    "bad-cp1252": (b"a,b\n" + b"1,2\n" * 100 + b"3,\x81\n", {}),
    "no-rows": (b"a,b\n\n\n", {}),
}


@pytest.fixture
def small_blocks(monkeypatch):
    """Both paths read blocks of the same (small) size, so batches coincide."""
    monkeypatch.setattr(ingest, "BLOCK_CHARS", 997)
    monkeypatch.setattr(ingest, "NATIVE_BLOCK_CHARS", 997)


def _ingest_both(tmp_path: Path, data: bytes, kw: dict, kek: bytes):
    src = tmp_path / "in.csv"
    src.write_bytes(data)
    store = FilesystemStore(tmp_path / "store")
    out = []
    for version, native in ((1, True), (2, False)):
        ids = {"site": "s", "dataset": "d", "version": version}
        try:
            result = ingest_csv(
                src, store=store, kek=kek, tmp_dir=tmp_path, native=native, **ids, **kw
            )
        except IngestError as exc:
            out.append(("error", str(exc)))
            continue
        payload = decrypt_all(
            kek=kek,
            aad=associated_data(**ids),
            source=io.BytesIO(store.get_bytes(result.store_key)),
        )
        summary = asdict(result)
        for key in ("store_key", "size_bytes", "ciphertext_sha256"):
            summary.pop(key)
        out.append((payload, summary))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_native_and_python_paths_store_the_same_payload_and_profile(
    case, tmp_path, kek, small_blocks
):
    data, kw = CASES[case]

    native, python = _ingest_both(tmp_path, data, kw, kek)

    assert native[0] != "error", native[1]
    assert native == python


@pytest.mark.parametrize("case", sorted(BAD))
def test_native_and_python_paths_refuse_a_bad_file_with_the_same_message(
    case, tmp_path, kek, small_blocks
):
    data, kw = BAD[case]

    native, python = _ingest_both(tmp_path, data, kw, kek)

    assert native[0] == "error"
    assert native == python


def test_native_path_is_taken_for_quote_free_blocks():
    text = "a,b\n" + "1,x\n" * 50 + '2,"y"\n' + "3,z\n" * 50
    reader = RecordReader(
        io.StringIO(text, newline=""), block_chars=100, native=lambda: ["int", "dict"]
    )

    batches = list(reader.batches())

    assert any(b.native for b in batches) and not all(b.native for b in batches)
    assert sum(b.n_rows for b in batches) == 101
    lines = [b.line_of(i) for b in batches for i in range(b.n_rows)]
    assert lines == list(range(2, 103))
    native = next(b for b in batches if b.native)
    assert native.array(0).to_pylist()[:2] == [1, 1]
    assert list(native.column(1)[:2]) == ["x", "x"]


def test_large_generated_file_same_payload_and_profile(tmp_path, kek, monkeypatch):
    src = tmp_path / "big.csv"
    rows = generate_csv(src, 6 << 20)
    monkeypatch.setattr(ingest, "BLOCK_CHARS", 1 << 20)
    monkeypatch.setattr(ingest, "NATIVE_BLOCK_CHARS", 1 << 20)

    native, python = _ingest_both(tmp_path, src.read_bytes(), {}, kek)

    assert native[1]["row_count"] == rows
    assert native[0] == src.read_bytes() + native[0][src.stat().st_size :]  # comma: passthrough
    assert native == python


# --- ColumnStats: add_array agrees with add_batch -------------------------------------------------

ALPHABET = "0123456789+-.eE _naiftrTF\xa0"


def _state(col: ColumnStats) -> dict:
    out = asdict(col)
    out.pop("_valid_dates")
    out["categories"] = dict(col.categories) if col.categories is not None else None
    return out


def _split(cells: list[str], shape: str, markers: tuple[str, ...]):
    """``cells`` as one column through Arrow's CSV parser, as ingest would get it."""
    text = "".join(f"{cell}\n" for cell in cells)
    if '"' in text or "\r" in text or any(not c.strip() for c in cells):
        return None
    split = arrowcsv.split_block(text, width=1, delimiter=",", shapes=[shape], markers=markers)
    return None if split is None else split[0][0]


def _add(col: ColumnStats, cells: list[str], markers: tuple[str, ...], native: bool) -> str | None:
    numeric = any(m and not m.strip("0123456789.eE+-") for m in markers)
    try:
        if native:
            array = _split(cells, col.native_shape(numeric), markers)
            neg_zero = arrowcsv.NEG_ZERO.search("\n".join(cells)) is not None
            if array is not None and col.add_native(array, frozenset(markers), lambda: neg_zero):
                return None
        col.add_batch(cells, frozenset(markers))
    except CellError as exc:
        return f"{exc.index}:{exc.expected}"
    return None


@pytest.mark.parametrize("seed", range(6))
def test_add_native_matches_add_batch_on_random_cells(seed):
    rng = random.Random(seed)
    vocab = ["1", "2.5", "-0", "+7", "1e3", "true", "FALSE", "2020-01-31", "2021-02-30", "NA"]
    native_batches = 0
    for _ in range(300):
        declared = rng.choice([None, None, "int", "float", "str", "bool", "date"])
        markers = rng.choice([("",), ("", "NA"), ("-999",), ()])
        a, b = ColumnStats("c", declared=declared), ColumnStats("c", declared=declared)
        for _batch in range(rng.randint(1, 4)):
            cells = [
                rng.choice(vocab)
                if rng.random() < 0.6
                else "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 5)))
                for _ in range(rng.randint(1, 8))
            ]
            if rng.random() < 0.4:
                cells = [str(rng.randint(-50, 50)) for _ in cells]
            if rng.random() < 0.2:
                cells = [f"{rng.uniform(-9, 9):.3f}" for _ in cells]
            native_batches += _split(cells, a.native_shape(False), markers) is not None
            errors = (_add(a, cells, markers, True), _add(b, cells, markers, False))
            assert errors[0] == errors[1], (cells, declared, markers)
            if errors[0] is not None:
                break
            assert _state(a) == _state(b), (cells, declared, markers)
    assert native_batches > 300  # the native path was exercised, not only the fallback


def test_int_shape_reads_numbers_like_float_and_refuses_what_python_reads_otherwise():
    cells = ["7", " 12 ", "-3", "007", "9007199254740993"]

    array = _split(cells, "int", ("",))

    assert arrowcsv.numbers(array).tolist() == [float(c) for c in cells]
    for refused in (["+5"], ["1.5"], ["1_0"], ["99999999999999999999"], ["nan"]):
        assert _split(refused, "int", ("",)) is None


def test_float_shape_equals_python_float():
    rng = np.random.default_rng(1)
    cells = [repr(float(x)) for x in rng.normal(size=500) * 10.0 ** rng.integers(-30, 30, 500)]
    cells += ["0.1000000000000000055511151231257827", "-0", "+.5", "5.", "1E-3"]

    values = arrowcsv.numbers(_split(cells, "float", ("",)))

    assert values.tolist() == [float(c) for c in cells]
    assert str(values[-4]) == "-0.0"
    for refused in (["1_0"], ["\u0663"], ["0x10"], ["1e"], ["-"]):
        assert _split(refused, "float", ("",)) is None


def test_neg_zero_pattern():
    assert arrowcsv.NEG_ZERO.search("1,-0,2")
    assert arrowcsv.NEG_ZERO.search("-00\n")
    assert arrowcsv.NEG_ZERO.search("a; -0 ;b")
    assert not arrowcsv.NEG_ZERO.search("1,-0.5,-10,2020-01-01")

"""Tests for sandbox.ingest: CSV validation, typing, suppressed profile and encrypted storage."""

from __future__ import annotations

import hashlib
import io
import json
import math

import pytest

from sandbox.crypto import associated_data, decrypt_all
from sandbox.csvformat import split_trailer
from sandbox.ingest import (
    IngestError,
    classify_value,
    ingest_csv,
    safe_count,
    store_key_for,
)
from sandbox.storage import FilesystemStore, StorageError

CANARY = "ZEBRA-CANARY-7731"


def _cohort_csv() -> str:
    """40 rows: id int, age int, bmi float (2 missing), sex str (A×25, B×12, rare×3), label."""
    lines = ["id,age,bmi,sex,label"]
    for i in range(40):
        age = 20 + i
        bmi = "" if i in (5, 6) else f"{18.5 + i * 0.25:.2f}"
        if i < 25:
            sex = "A"
        elif i < 37:
            sex = "B"
        else:
            sex = CANARY if i == 37 else f"rare{i}"
        lines.append(f"{i},{age},{bmi},{sex},{i % 2}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def store(tmp_path) -> FilesystemStore:
    return FilesystemStore(tmp_path / "store")


@pytest.fixture
def staging(tmp_path):
    path = tmp_path / "staging"
    path.mkdir()
    return path


def _ingest(path, store, kek, staging, **kw):
    params = {"site": "hospital-a", "dataset": "cohort", "version": 1}
    params.update(kw)
    return ingest_csv(path, store=store, kek=kek, tmp_dir=staging, **params)


def _objects(store) -> list[str]:
    return sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*") if p.is_file())


def test_ingest_records_schema_rows_and_hash(tmp_path, store, kek, staging):
    src = tmp_path / "cohort.csv"
    src.write_text(_cohort_csv())

    result = _ingest(src, store, kek, staging)

    assert result.store_key == "hospital-a/cohort/v1.csv.enc"
    assert result.schema == [
        {"name": "id", "type": "int"},
        {"name": "age", "type": "int"},
        {"name": "bmi", "type": "float"},
        {"name": "sex", "type": "str"},
        {"name": "label", "type": "int"},
    ]
    assert result.row_count == 40
    stored = store.get_bytes(result.store_key)
    assert result.size_bytes == len(stored)
    assert result.ciphertext_sha256 == hashlib.sha256(stored).hexdigest()
    assert _objects(store) == ["hospital-a/cohort/v1.csv.enc"]
    assert list(staging.iterdir()) == []


def test_stored_object_is_the_encrypted_canonical_payload(tmp_path, store, kek, staging):
    src = tmp_path / "cohort.csv"
    src.write_text(_cohort_csv())

    result = _ingest(src, store, kek, staging)

    stored = store.get_bytes(result.store_key)
    assert CANARY.encode() not in stored
    assert b"age,bmi" not in stored
    aad = associated_data(site="hospital-a", dataset="cohort", version=1)
    payload = decrypt_all(kek=kek, aad=aad, source=io.BytesIO(stored))
    start, meta = split_trailer(payload)
    assert payload[:start] == src.read_bytes()  # a UTF-8 comma CSV is stored as it is
    assert json.loads(meta) == {
        "format": "frp-csv/1",
        "columns": result.schema,
        "missing_values": [""],
        "rows": 40,
    }
    assert result.source_bytes == len(src.read_bytes())
    assert result.source_sha256 == hashlib.sha256(src.read_bytes()).hexdigest()


def test_profile_suppresses_small_counts_and_rare_values(tmp_path, store, kek, staging):
    src = tmp_path / "cohort.csv"
    src.write_text(_cohort_csv())

    profile = _ingest(src, store, kek, staging).profile

    columns = {c["name"]: c for c in profile["columns"]}
    assert [c["name"] for c in profile["columns"]] == ["id", "age", "bmi", "sex", "label"]
    sex = columns["sex"]
    assert sex["type"] == "str"
    assert sex["categories"] == [{"value": "A", "count": 25}, {"value": "B", "count": 10}]
    assert sex["other"] == "≤7"
    assert sex["missing"] == 0
    bmi = columns["bmi"]
    assert bmi["missing"] == "≤7"
    assert bmi["count"] == 40  # 38 rounded to the nearest 5
    values = [18.5 + i * 0.25 for i in range(40) if i not in (5, 6)]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert bmi["mean"] == float(f"{mean:.3g}")
    assert bmi["std"] == float(f"{std:.3g}")
    assert "min" not in bmi and "max" not in bmi  # single-record values are never released
    text = json.dumps(profile, ensure_ascii=False)
    assert CANARY not in text
    assert "rare3" not in text


def test_profile_withholds_summaries_of_tiny_columns(tmp_path, store, kek, staging):
    src = tmp_path / "tiny.csv"
    src.write_text("x,y\n1,a\n2,a\n3,b\n")

    profile = _ingest(src, store, kek, staging).profile

    x, y = profile["columns"]
    assert x["count"] == "≤7"
    assert x["mean"] is None and x["std"] is None
    assert y["categories"] == []
    assert y["other"] == "≤7"
    assert '"a"' not in json.dumps(profile)


def test_profile_caps_categories_at_20(tmp_path, store, kek, staging):
    rows = [f"c{k:02d}" for k in range(25) for _ in range(8 + k)]
    src = tmp_path / "many.csv"
    src.write_text("cat\n" + "\n".join(rows) + "\n")

    col = _ingest(src, store, kek, staging).profile["columns"][0]

    assert len(col["categories"]) == 20
    assert col["categories"][0]["value"] == "c24"
    assert all(isinstance(c["count"], int) and c["count"] % 5 == 0 for c in col["categories"])


@pytest.mark.parametrize(
    ("n", "expected"), [(0, 0), (1, "≤7"), (7, "≤7"), (8, 10), (12, 10), (13, 15), (100, 100)]
)
def test_safe_count(n, expected):
    assert safe_count(n) == expected


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("", None),
        ("  ", None),
        ("12", "int"),
        ("-3", "int"),
        (" +4 ", "int"),
        ("1.5", "float"),
        ("1e3", "float"),
        (".5", "float"),
        ("nan", "str"),
        ("inf", "str"),
        ("1_000", "str"),
        ("١٢", "str"),
        ("12a", "str"),
    ],
)
def test_classify_value(value, kind):
    assert classify_value(value) == kind


def test_types_widen_int_float_str(tmp_path, store, kek, staging):
    src = tmp_path / "w.csv"
    src.write_text("a,b,c,d\n1,1,1,\n2,2.5,x,\n")

    result = _ingest(src, store, kek, staging)

    assert [c["type"] for c in result.schema] == ["int", "float", "str", "str"]


def test_quoted_fields_and_bom(tmp_path, store, kek, staging):
    src = tmp_path / "q.csv"
    src.write_bytes('\ufeffname,note\n"Smith, J","line one\nline two"\n'.encode())

    result = _ingest(src, store, kek, staging)

    assert result.schema[0]["name"] == "name"
    assert result.row_count == 1


def test_ragged_row_names_the_line_and_stores_nothing(tmp_path, store, kek, staging):
    src = tmp_path / "ragged.csv"
    rows = ["a,b,c"] + [f"{i},{i},{i}" for i in range(5)] + ["5,5"] + ["6,6,6"]
    src.write_text("\n".join(rows) + "\n")

    with pytest.raises(IngestError, match="line 7: expected 3 fields, found 2"):
        _ingest(src, store, kek, staging)

    assert _objects(store) == []
    assert list(staging.iterdir()) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file"),
        ("a,b,a\n1,2,3\n", "duplicate column name 'a'"),
        ("a,,c\n1,2,3\n", "line 1, column 2: empty column name"),
        ("a,b\n", "no data rows"),
        ('a,b\n1,"unterminated\n', "line"),
    ],
)
def test_bad_csv_is_refused(tmp_path, store, kek, staging, content, message):
    src = tmp_path / "bad.csv"
    src.write_text(content)

    with pytest.raises(IngestError, match=message):
        _ingest(src, store, kek, staging)

    assert _objects(store) == []
    assert list(staging.iterdir()) == []


def test_invalid_utf8_after_the_sample_names_line_and_column(tmp_path, store, kek, staging):
    src = tmp_path / "late.csv"
    rows = [f"{i},ok" for i in range(9000)]  # > 64 KiB of valid UTF-8 first
    src.write_bytes(("id,name\n" + "\n".join(rows) + "\n").encode() + b"9000,Jos\xe9\n")

    with pytest.raises(IngestError) as info:
        _ingest(src, store, kek, staging)

    message = str(info.value)
    assert message.startswith("line 9002, column 'name': bytes that are not valid utf-8")
    assert "encoding='cp1252'" in message
    assert _objects(store) == []
    assert list(staging.iterdir()) == []


def test_failed_put_leaves_no_object_and_no_temp_file(tmp_path, store, kek, staging, monkeypatch):
    src = tmp_path / "cohort.csv"
    src.write_text(_cohort_csv())

    def broken_put(key, path):
        assert path.parent == staging and path.exists()
        raise StorageError("store unavailable")

    monkeypatch.setattr(store, "put_file", broken_put)
    with pytest.raises(StorageError, match="store unavailable"):
        _ingest(src, store, kek, staging)

    assert _objects(store) == []
    assert list(staging.iterdir()) == []


def test_existing_version_is_not_overwritten(tmp_path, store, kek, staging):
    src = tmp_path / "cohort.csv"
    src.write_text(_cohort_csv())
    first = _ingest(src, store, kek, staging)

    with pytest.raises(IngestError, match="immutable"):
        _ingest(src, store, kek, staging)

    assert hashlib.sha256(store.get_bytes(first.store_key)).hexdigest() == first.ciphertext_sha256


@pytest.mark.parametrize(
    "params",
    [{"site": "../x"}, {"dataset": "a/b"}, {"version": -1}, {"dataset": ".hidden"}],
)
def test_invalid_names_are_refused(tmp_path, store, kek, staging, params):
    src = tmp_path / "cohort.csv"
    src.write_text(_cohort_csv())
    with pytest.raises(IngestError):
        _ingest(src, store, kek, staging, **params)
    assert _objects(store) == []


def test_bad_kek_is_refused(tmp_path, store, staging):
    src = tmp_path / "cohort.csv"
    src.write_text(_cohort_csv())
    with pytest.raises(IngestError, match="32 bytes"):
        _ingest(src, store, b"short", staging)


def test_store_key_for():
    assert store_key_for(site="s", dataset="d", version=12) == "s/d/v12.csv.enc"

"""Tests for sandbox.loader: decrypt in memory, parse, X/y and the stratified split."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sandbox.crypto import associated_data, encrypt_stream, generate_key
from sandbox.csvformat import encode_trailer
from sandbox.ingest import ingest_csv
from sandbox.loader import (
    LoaderError,
    Table,
    load_table,
    load_xy,
    parse_payload,
    parse_table,
    train_test_split,
    training_columns,
)
from sandbox.storage import FilesystemStore

ROOT = Path(__file__).resolve().parents[2]
IDS = {"site": "hospital-a", "dataset": "cohort", "version": 2}


def _csv() -> str:
    lines = ["id,age,bmi,smoker,outcome,note"]
    for i in range(30):
        bmi = "" if i == 4 else f"{20 + i / 4:.2f}"
        smoker = "yes" if i % 3 == 0 else "no"
        outcome = "sick" if i % 4 == 0 else "well"
        lines.append(f"{i},{30 + i},{bmi},{smoker},{outcome},n{i}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def stored(tmp_path, kek):
    store = FilesystemStore(tmp_path / "store")
    src = tmp_path / "cohort.csv"
    src.write_text(_csv())
    result = ingest_csv(src, store=store, kek=kek, tmp_dir=tmp_path, **IDS)
    return store, result


def test_load_table_reads_back_what_ingest_wrote(stored, kek):
    store, result = stored

    table = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)

    assert table.columns == ["id", "age", "bmi", "smoker", "outcome", "note"]
    assert table.types == {s["name"]: s["type"] for s in result.schema}
    assert table.n_rows == result.row_count == 30
    assert table.data["age"].dtype == np.float64
    assert table.data["age"][:3].tolist() == [30.0, 31.0, 32.0]
    assert np.isnan(table.data["bmi"][4])
    assert table.data["smoker"].dtype == object
    assert table.data["smoker"][:2].tolist() == ["yes", "no"]


def test_load_table_with_wrong_key_or_ids_fails(stored, kek):
    store, result = stored
    with pytest.raises(LoaderError, match="cannot decrypt"):
        load_table(store=store, kek=generate_key(), store_key=result.store_key, **IDS)
    with pytest.raises(LoaderError, match="cannot decrypt"):
        load_table(store=store, kek=kek, store_key=result.store_key, **{**IDS, "version": 3})


def test_load_table_missing_object_hides_site_paths(stored, kek):
    store, _ = stored
    with pytest.raises(LoaderError, match="cannot read dataset object") as info:
        load_table(store=store, kek=kek, store_key="hospital-a/cohort/v9.csv.enc", **IDS)
    assert str(store.root) not in str(info.value)


def test_load_table_tampered_object(stored, kek, tmp_path):
    store, result = stored
    data = bytearray(store.get_bytes(result.store_key))
    data[-3] ^= 0x10
    tampered = tmp_path / "tampered.enc"
    tampered.write_bytes(bytes(data))
    store.put_file(result.store_key, tampered)
    with pytest.raises(LoaderError, match="cannot decrypt"):
        load_table(store=store, kek=kek, store_key=result.store_key, **IDS)


def test_load_xy_defaults_to_numeric_features(stored, kek):
    store, result = stored
    table = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)
    table.data["bmi"][4] = 25.0  # fill the missing value

    X, y = load_xy(table, target="outcome")

    assert X.shape == (30, 3) and X.dtype == np.float64  # id, age, bmi
    assert X[1].tolist() == [1.0, 31.0, 20.25]
    assert y.dtype == np.int64
    assert y[:5].tolist() == [0, 1, 1, 1, 0]  # sorted labels: sick=0, well=1


def test_load_xy_explicit_features_numeric_target(stored, kek):
    store, result = stored
    table = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)

    X, y = load_xy(table, target="id", features=["age"])

    assert X.shape == (30, 1)
    assert y.tolist() == list(range(30))


def test_load_xy_with_global_classes(stored, kek):
    store, result = stored
    table = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)

    _, y = load_xy(table, target="outcome", features=["age"], classes=["well", "other", "sick"])

    assert y[:2].tolist() == [2, 0]
    with pytest.raises(LoaderError, match="outside the given classes"):
        load_xy(table, target="outcome", features=["age"], classes=["well"])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"target": "missing"}, "no column 'missing'"),
        ({"target": "outcome", "features": ["age", "nope"]}, "no column 'nope'"),
        ({"target": "outcome", "features": ["smoker"]}, "feature 'smoker' is not numeric"),
        ({"target": "outcome", "features": ["bmi"]}, "feature 'bmi' has 1 missing values"),
        ({"target": "bmi", "features": ["age"]}, "target 'bmi' has missing values"),
        ({"target": "age", "features": ["age"]}, "cannot also be a feature"),
    ],
)
def test_load_xy_errors(stored, kek, kwargs, message):
    store, result = stored
    table = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)
    with pytest.raises(LoaderError, match=message):
        load_xy(table, **kwargs)


def test_load_xy_non_integer_numeric_target():
    table = parse_table("x,y\n1,0.5\n2,1\n")
    with pytest.raises(LoaderError, match="non-integer"):
        load_xy(table, target="y")


def test_parse_table_matches_ingest_rules():
    table = parse_table('a,b,c\n1,2.5,x\n,3,"y, z"\n\n4,5,\n')
    assert isinstance(table, Table)
    assert table.types == {"a": "int", "b": "float", "c": "str"}
    assert np.isnan(table.data["a"][1])
    assert table.data["c"].tolist() == ["x", "y, z", None]


def _labelled(n_per_class: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    y = np.concatenate([np.full(n, label, dtype=np.int64) for label, n in n_per_class.items()])
    X = np.arange(len(y), dtype=np.float64).reshape(-1, 1)
    return X, y


def test_split_is_deterministic_disjoint_and_covering():
    X, y = _labelled({0: 50, 1: 30, 2: 20})

    first = train_test_split(X, y, test_fraction=0.2, seed=7)
    again = train_test_split(X, y, test_fraction=0.2, seed=7)
    other = train_test_split(X, y, test_fraction=0.2, seed=8)

    for a, b in zip(first, again, strict=True):
        assert np.array_equal(a, b)
    assert not np.array_equal(first[2], other[2])
    X_train, y_train, X_test, y_test = first
    train_rows, test_rows = set(X_train[:, 0]), set(X_test[:, 0])
    assert not train_rows & test_rows
    assert train_rows | test_rows == set(X[:, 0])
    assert len(X_train) == len(y_train) and len(X_test) == len(y_test)
    assert np.array_equal(y[X_test[:, 0].astype(int)], y_test)


def test_split_is_stratified():
    X, y = _labelled({0: 50, 1: 30, 2: 20})

    _, y_train, _, y_test = train_test_split(X, y, test_fraction=0.2, seed=0)

    assert np.bincount(y_test).tolist() == [10, 6, 4]
    assert np.bincount(y_train).tolist() == [40, 24, 16]


def test_split_keeps_tiny_classes_on_both_sides():
    X, y = _labelled({0: 40, 1: 2, 2: 1})

    _, y_train, _, y_test = train_test_split(X, y, test_fraction=0.2)

    assert np.bincount(y_test, minlength=3).tolist() == [8, 1, 0]
    assert np.bincount(y_train, minlength=3).tolist() == [32, 1, 1]


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_split_rejects_bad_fraction(fraction):
    X, y = _labelled({0: 10})
    with pytest.raises(ValueError, match="test_fraction"):
        train_test_split(X, y, test_fraction=fraction)


def test_loader_imports_no_django_and_no_heavy_libraries():
    code = (
        "import sys, sandbox.loader, sandbox.keyring, sandbox.storage\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('django', 'sklearn', 'pandas', 'minio', 'scipy')]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


def test_parse_payload_refuses_a_malformed_trailer():
    bad_format = encode_trailer(json.dumps({"format": "other/9"}).encode())
    with pytest.raises(LoaderError, match="malformed dataset payload"):
        parse_payload(b"a\n1\n" + bad_format, where="k")


def test_parse_payload_refuses_a_header_that_does_not_match_the_schema():
    meta = {
        "format": "frp-csv/1",
        "columns": [{"name": "b", "type": "int"}],
        "missing_values": [""],
        "rows": 1,
    }
    with pytest.raises(LoaderError, match="header does not match"):
        parse_payload(b"a\n1\n" + encode_trailer(json.dumps(meta).encode()), where="k")


def test_parse_payload_uses_the_stored_types_and_markers():
    meta = {
        "format": "frp-csv/1",
        "columns": [{"name": "zip", "type": "str"}, {"name": "n", "type": "float"}],
        "missing_values": ["", "-999"],
        "rows": 3,
    }
    payload = b"zip,n\n01234,1\n-999,-999\n,2.5\n" + encode_trailer(json.dumps(meta).encode())

    table = parse_payload(payload)

    assert table.types == {"zip": "str", "n": "float"}
    assert table.data["zip"].tolist() == ["01234", None, None]
    assert np.isnan(table.data["n"][1]) and table.data["n"][2] == 2.5


# --- streaming load: column selection, stores that cannot seek, the trailer -----------------


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == np.float64:
        return bool(np.array_equal(a, b, equal_nan=True))
    return a.tolist() == b.tolist()


def test_load_table_columns_keeps_file_order_and_loads_only_those(stored, kek):
    store, result = stored

    table = load_table(
        store=store, kek=kek, store_key=result.store_key, columns=["outcome", "age"], **IDS
    )

    assert table.columns == ["age", "outcome"]
    assert set(table.data) == {"age", "outcome"}
    assert table.data["age"][:2].tolist() == [30.0, 31.0]
    assert table.data["outcome"][:2].tolist() == ["sick", "well"]


def test_training_columns_default_to_numeric_features_and_drop_unknown_names(stored, kek):
    store, result = stored
    key = result.store_key

    default = load_table(
        store=store, kek=kek, store_key=key, columns=training_columns("outcome"), **IDS
    )
    explicit = load_table(
        store=store,
        kek=kek,
        store_key=key,
        columns=training_columns("outcome", ["bmi", "nope"]),
        **IDS,
    )

    assert default.columns == ["id", "age", "bmi", "outcome"]
    assert explicit.columns == ["bmi", "outcome"]


def test_load_table_refuses_an_unknown_column(stored, kek):
    store, result = stored
    with pytest.raises(LoaderError, match=r"no column\(s\) \['nope'\]"):
        load_table(store=store, kek=kek, store_key=result.store_key, columns=["nope"], **IDS)


class _NoSeekStore:
    """A store whose streams cannot seek (like the S3 store's)."""

    def __init__(self, inner: FilesystemStore) -> None:
        self.inner = inner

    def open(self, key: str):
        data = self.inner.get_bytes(key)

        class Stream(io.RawIOBase):
            def __init__(self):
                self.buffer = io.BytesIO(data)

            def readable(self):
                return True

            def readinto(self, b):
                return self.buffer.readinto(b)

        return Stream()


def test_load_table_from_a_store_that_cannot_seek(stored, kek, monkeypatch):
    store, result = stored
    monkeypatch.setattr("sandbox.loader.NATIVE_MIN_BYTES", 0)

    plain = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)
    streamed = load_table(store=_NoSeekStore(store), kek=kek, store_key=result.store_key, **IDS)

    assert streamed.columns == plain.columns
    assert all(_same(streamed.data[c], plain.data[c]) for c in plain.columns)


@pytest.mark.parametrize("case", ["rows-comma", "na-declared", "numeric-markers", "tricky-numbers"])
def test_native_load_equals_the_python_rules(tmp_path, kek, monkeypatch, case):
    from tests.sandbox.test_arrowcsv import CASES

    data, kw = CASES[case]
    src = tmp_path / "in.csv"
    src.write_bytes(data * 40)  # several native blocks
    store = FilesystemStore(tmp_path / "store")
    result = ingest_csv(src, store=store, kek=kek, tmp_dir=tmp_path, **IDS, **kw)
    monkeypatch.setattr("sandbox.loader._NATIVE_BLOCK", 4096)
    monkeypatch.setattr("sandbox.loader.NATIVE_MIN_BYTES", 0)

    native = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)
    monkeypatch.setattr("sandbox.arrowcsv.AVAILABLE", False)
    python = load_table(store=store, kek=kek, store_key=result.store_key, **IDS)

    assert native.columns == python.columns and native.types == python.types
    assert all(_same(native.data[c], python.data[c]) for c in native.columns)


def _store_payload(tmp_path, kek, payload: bytes, chunk_size: int) -> FilesystemStore:
    store = FilesystemStore(tmp_path / "store")
    enc = tmp_path / "obj.enc"
    with open(enc, "wb") as sink:
        encrypt_stream(
            kek=kek,
            aad=associated_data(**IDS),
            source=io.BytesIO(payload),
            sink=sink,
            chunk_size=chunk_size,
        )
    store.put_file("hospital-a/cohort/v2.csv.enc", enc)
    return store


def _meta(rows: int, markers: list[str]) -> bytes:
    meta = {
        "format": "frp-csv/1",
        "columns": [{"name": "a", "type": "int"}, {"name": "b", "type": "str"}],
        "missing_values": markers,
        "rows": rows,
    }
    return json.dumps(meta).encode()


def test_a_trailer_longer_than_the_first_guess_across_small_chunks(tmp_path, kek):
    long_marker = "m" * 70_000  # the trailer is read in a second, longer tail
    payload = b"a,b\n1,x\n2,\n" + encode_trailer(_meta(2, ["", long_marker]))
    store = _store_payload(tmp_path, kek, payload, chunk_size=1000)

    table = load_table(store=store, kek=kek, store_key="hospital-a/cohort/v2.csv.enc", **IDS)

    assert table.data["a"].tolist() == [1.0, 2.0]
    assert table.data["b"].tolist() == ["x", None]


def test_a_row_count_that_differs_from_the_trailer_is_refused(tmp_path, kek):
    payload = b"a,b\n1,x\n2,y\n3,z\n" + encode_trailer(_meta(2, [""]))
    store = _store_payload(tmp_path, kek, payload, chunk_size=64)
    with pytest.raises(LoaderError, match="3 rows parsed but 2 recorded"):
        load_table(store=store, kek=kek, store_key="hospital-a/cohort/v2.csv.enc", **IDS)


def test_a_small_dataset_loads_without_importing_pyarrow(stored, kek):
    store, result = stored
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sandbox.loader import load_table\n"
        "from sandbox.storage import FilesystemStore\n"
        f"t = load_table(store=FilesystemStore(Path({str(store.root)!r})), kek={kek!r}, "
        f"store_key={result.store_key!r}, **{IDS!r})\n"
        "print(t.n_rows, 'pyarrow' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == ["30", "False"]


@pytest.mark.integration
def test_load_table_streams_from_a_real_s3_store(seaweed_s3, tmp_path, kek, monkeypatch):
    # The S3 store's stream cannot seek: the trailer comes from a first decryption pass.
    monkeypatch.setattr("sandbox.loader.NATIVE_MIN_BYTES", 0)
    monkeypatch.setattr("sandbox.loader._NATIVE_BLOCK", 256)
    src = tmp_path / "cohort.csv"
    src.write_text(_csv() * 1 + "".join(_csv().splitlines(True)[1:]) * 20)
    s3 = seaweed_s3.store()
    local = FilesystemStore(tmp_path / "store")
    ids = {**IDS, "dataset": "s3-stream"}
    result = ingest_csv(src, store=s3, kek=kek, tmp_dir=tmp_path, **ids)
    local.put_file(result.store_key, _download(s3, result.store_key, tmp_path))

    from_disk = load_table(store=local, kek=kek, store_key=result.store_key, **ids)
    monkeypatch.setattr("sandbox.loader.decrypt_tail", _no_seek)
    from_s3 = load_table(store=s3, kek=kek, store_key=result.store_key, **ids)

    assert from_s3.n_rows == 21 * 30
    assert from_s3.columns == from_disk.columns
    assert all(_same(from_s3.data[c], from_disk.data[c]) for c in from_s3.columns)


def _no_seek(**_kw):
    raise AssertionError("the S3 stream was treated as seekable")


def _download(store, key: str, tmp_path: Path) -> Path:
    path = tmp_path / "object.enc"
    path.write_bytes(store.get_bytes(key))
    return path

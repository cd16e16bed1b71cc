"""Site-side loader the Flower ClientApp uses to read its own dataset (imports no Django).

Owns turning a stored, encrypted dataset version into training arrays: fetch the object, read
the trailer that ``sandbox.ingest`` stored after the canonical CSV (schema, missing-value
markers, row count; ADR 0007), then decrypt the object chunk by chunk and parse its CSV block by
block straight into numpy arrays allocated for the recorded row count — only for the columns a
job asks for (``load_table(columns=...)``, ``training_columns``) — so neither the plaintext nor
the table as Python objects is ever held (plaintext never touches disk). Quote-free blocks are
split and converted by Arrow (``sandbox.arrowcsv``, imported only for a payload that needs it);
the rest follows the ``sandbox.csvformat`` rules in Python, with the same results. ``X``/``y``
and a deterministic stratified train/test split use numpy only — no pandas or scikit-learn
import, since the ClientApp pays every import on every Flower message. Objects stored before
the canonical format (the original UTF-8 CSV bytes) are decrypted whole and parsed with the
rules of that time: empty cells missing, types ``int``/``float``/``str`` inferred.

Every failure raises ``LoaderError`` whose message names the object key or column but never a
site file path, store host or data value, because ClientApp errors travel to the ServerApp
(store details are logged locally instead).
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from sandbox import arrowcsv
from sandbox.crypto import CryptoError, associated_data, decrypt_stream, decrypt_tail
from sandbox.csvformat import (
    DEFAULT_MISSING_VALUES,
    NUMERIC_TYPES,
    PAYLOAD_FORMAT,
    TRAILER_MAGIC,
    TYPES,
    CsvError,
    RecordReader,
    column_values,
    infer_kind,
    parses_as_float,
    split_trailer,
    strip_all,
)
from sandbox.storage import ObjectStore, StorageError

logger = logging.getLogger(__name__)

LEGACY_ENCODING = "utf-8-sig"
LEGACY_TYPES = ("int", "float", "str")


class LoaderError(Exception):
    """The dataset cannot be loaded or turned into training arrays."""


@dataclass
class Table:
    """A decrypted dataset in columns.

    ``columns``: names in file order; ``data[name]``: ``(n,)`` array — ``float64`` for ``int`` and
    ``float`` columns (missing → ``nan``), ``object`` of ``str`` for ``str`` columns and of
    ``bool`` for ``bool`` columns (missing → ``None``), ``datetime64[D]`` for ``date`` columns
    (missing → ``NaT``); ``types[name]``: the column's type as recorded at ingest.
    """

    columns: list[str]
    data: dict[str, np.ndarray]
    types: dict[str, str] = field(default_factory=dict)

    @property
    def n_rows(self) -> int:
        """Number of rows."""
        return len(self.data[self.columns[0]]) if self.columns else 0

    def numeric_columns(self) -> list[str]:
        """Names of the ``int`` and ``float`` columns, in file order."""
        return [name for name in self.columns if self.types.get(name) in NUMERIC_TYPES]


Columns = Sequence[str] | Callable[[list[tuple[str, str]]], Sequence[str]] | None


def training_columns(target: str, features: Sequence[str] | None = None):
    """A ``columns`` selector for ``load_table``: ``target`` and ``features`` — by default every
    ``int``/``float`` column except ``target``, the rule of ``load_xy`` — in file order. Names
    not in the dataset are left out, so the caller can name them in its own error."""

    def select(schema: list[tuple[str, str]]) -> list[str]:
        if features:
            wanted = {target, *features}
            return [name for name, _ in schema if name in wanted]
        return [n for n, kind in schema if n == target or kind in NUMERIC_TYPES]

    return select


def load_table(
    *,
    store: ObjectStore,
    kek: bytes,
    store_key: str,
    site: str,
    dataset: str,
    version: int,
    columns: Columns = None,
) -> Table:
    """Fetch ``store_key``, decrypt it with ``kek`` and parse it into a ``Table``.

    ``site``/``dataset``/``version`` must be those the object was ingested under (they form
    the associated data). ``columns``: the names to load (file order is kept), or a function
    of the recorded schema ``[(name, type)]`` returning them (``training_columns``), or
    ``None`` for every column.

    Streams: the trailer (ADR 0007: schema, markers, row count) is read first — from the last
    chunk(s) when the store's stream can seek, else by one extra decryption pass — then the
    object is decrypted chunk by chunk and its CSV parsed block by block (``pyarrow`` for
    quote-free blocks, ``sandbox.csvformat`` rules otherwise) straight into arrays allocated
    for the recorded row count. Memory: the arrays of the selected columns (8 bytes per row
    and column; a ``str`` column holds one pointer per row plus its distinct values) plus a
    constant (about 30 MB of buffers), never the plaintext. The arrays are returned only
    after every chunk and the trailer verified. Objects stored before the canonical format
    are decrypted whole in memory and parsed as before.

    Raises ``LoaderError`` if the object is missing or unreadable, fails to decrypt or
    authenticate (wrong key, wrong site/dataset/version, tampered or truncated), is not a
    valid dataset payload, or ``columns`` names a column the dataset does not have.
    """
    try:
        aad = associated_data(site=site, dataset=dataset, version=version)
        trailer = _read_trailer(store, store_key, kek, aad)
        if trailer is None:  # stored before the canonical format
            with store.open(store_key) as stream:
                plaintext = _decrypt(kek=kek, aad=aad, source=stream)
            try:
                return _select(parse_payload(plaintext, where=store_key), columns, store_key)
            finally:
                del plaintext
        total, raw_trailer, meta = trailer
        schema, missing, rows = _parse_meta(meta, store_key)
        names = _selected(schema, columns, store_key)
        with store.open(store_key) as stream:
            source = _PlaintextReader(
                decrypt_stream(kek=kek, aad=aad, source=stream), csv_bytes=total - len(raw_trailer)
            )
            table = _parse_canonical(
                source,
                where=store_key,
                schema=schema,
                missing=missing,
                rows=rows,
                names=names,
                native=total >= NATIVE_MIN_BYTES,
            )
            if source.finish() != raw_trailer:
                raise LoaderError(f"{store_key}: the trailer changed while the object was read")
        return table
    except StorageError as exc:
        # The store's message may name site paths or hosts: log it here, send a clean one on.
        logger.warning("cannot read dataset object %r: %s", store_key, exc)
        raise LoaderError(
            f"cannot read dataset object {store_key!r} from the site's object store"
        ) from None
    except CryptoError as exc:
        raise LoaderError(f"cannot decrypt dataset object {store_key!r}: {exc}") from None


_TAIL_GUESS = 64 * 1024


def _read_trailer(
    store: ObjectStore, key: str, kek: bytes, aad: bytes
) -> tuple[int, bytes, bytes] | None:
    """``(payload bytes, trailer bytes, meta JSON bytes)``, or ``None`` for an object without
    a trailer. Raises ``CryptoError``/``StorageError``."""
    size = _TAIL_GUESS
    while True:
        tail, total = _payload_tail(store, key, kek, aad, size)
        split = split_trailer(tail)
        if split is not None:
            start, meta = split
            return total, bytes(tail[start:]), meta
        if len(tail) < size or len(tail) < len(TRAILER_MAGIC) + 4:
            return None  # the whole payload was read: no trailer
        if tail[-len(TRAILER_MAGIC) :] != TRAILER_MAGIC:
            return None
        needed = (
            len(TRAILER_MAGIC)
            + 4
            + int.from_bytes(tail[-len(TRAILER_MAGIC) - 4 : -len(TRAILER_MAGIC)], "big")
        )
        if needed <= size or needed > total:
            return None
        size = needed


def _payload_tail(store: ObjectStore, key: str, kek: bytes, aad: bytes, size: int):
    """The last ``size`` plaintext bytes and the plaintext length (seek if the stream can,
    else decrypt it all, keeping only the tail)."""
    with store.open(key) as stream:
        if _seekable(stream):
            return decrypt_tail(kek=kek, aad=aad, source=stream, size=size)
        tail = bytearray()
        total = 0
        for chunk in decrypt_stream(kek=kek, aad=aad, source=stream):
            total += len(chunk)
            tail += chunk
            if len(tail) > 2 * size:
                del tail[: len(tail) - size]
        return bytes(tail[max(0, len(tail) - size) :]), total


def _seekable(stream) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, ValueError):
        return False


class _PlaintextReader(io.RawIOBase):
    """Raw reader over verified plaintext chunks that ends after ``csv_bytes`` bytes; the rest
    (the trailer) is kept for ``finish``, which drains the chunks (so the final chunk and the
    absence of trailing data are verified) and returns it."""

    def __init__(self, chunks: Iterator[bytes], *, csv_bytes: int) -> None:
        super().__init__()
        self._chunks = chunks
        self._left = csv_bytes
        self._pending = memoryview(b"")
        self._rest = bytearray()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending and self._left > 0:
            chunk = next(self._chunks, None)
            if chunk is None:
                raise LoaderError("the dataset payload ends before its recorded length")
            view = memoryview(chunk)
            self._pending, rest = view[: self._left], view[self._left :]
            self._rest += rest
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        self._left -= n
        return n

    def finish(self) -> bytes:
        """Drain the chunks and return the bytes after the CSV (the trailer)."""
        while self._left > 0:
            if not self.readinto(bytearray(1 << 20)):
                break
        for chunk in self._chunks:
            self._rest += chunk
        return bytes(self._rest)


def _parse_meta(raw_meta: bytes, where: str) -> tuple[list[tuple[str, str]], tuple[str, ...], int]:
    try:
        meta = json.loads(raw_meta)
        if meta.get("format") != PAYLOAD_FORMAT:
            raise ValueError(f"unknown payload format {meta.get('format')!r}")
        schema = [(str(c["name"]), str(c["type"])) for c in meta["columns"]]
        missing = tuple(str(m) for m in meta["missing_values"])
        rows = int(meta["rows"])
        if any(kind not in TYPES for _, kind in schema) or rows < 0:
            raise ValueError("unknown column type or negative row count")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LoaderError(f"{where}: malformed dataset payload ({exc})") from None
    return schema, missing, rows


def _selected(schema: list[tuple[str, str]], columns: Columns, where: str) -> list[str]:
    names = [name for name, _ in schema]
    if columns is None:
        return names
    wanted = list(columns(schema) if callable(columns) else columns)
    unknown = [name for name in wanted if name not in names]
    if unknown:
        raise LoaderError(f"{where}: no column(s) {unknown} in the dataset")
    keep = set(wanted)
    return [name for name in names if name in keep]


def _select(table: Table, columns: Columns, where: str) -> Table:
    """``table`` restricted to ``columns`` (for objects parsed whole)."""
    schema = [(name, table.types[name]) for name in table.columns]
    names = _selected(schema, columns, where)
    return Table(
        columns=names,
        data={n: table.data[n] for n in names},
        types={n: table.types[n] for n in names},
    )


def _decrypt(*, kek: bytes, aad: bytes, source: BinaryIO) -> bytearray:
    """All-or-nothing decryption into one buffer (``crypto.decrypt_all`` without its final copy):
    on any failure the partial plaintext is overwritten and ``CryptoError`` propagates."""
    buffer = bytearray()
    try:
        for chunk in decrypt_stream(kek=kek, aad=aad, source=source):
            buffer += chunk
    except BaseException:
        buffer[:] = bytes(len(buffer))
        raise
    return buffer


class _ViewReader(io.RawIOBase):
    """Raw reader over a memoryview (no copy of the whole payload)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = min(len(buffer), len(self._view) - self._pos)
        buffer[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n


def _text(view: memoryview, encoding: str) -> io.TextIOWrapper:
    return io.TextIOWrapper(
        io.BufferedReader(_ViewReader(view), 1 << 20),
        encoding=encoding,
        errors="strict",
        newline="",
    )


def parse_payload(payload: bytes | bytearray | memoryview, *, where: str = "dataset") -> Table:
    """Parse a decrypted payload (canonical CSV + trailer, or a legacy CSV) into a ``Table``.

    Raises ``LoaderError`` if the trailer is malformed, the CSV does not match it (header, row
    count, a value that does not fit its type) or, for a legacy object, the CSV is invalid.
    """
    view = memoryview(payload)
    split = split_trailer(view)
    if split is None:
        return _parse(
            _text(view, LEGACY_ENCODING),
            where=where,
            schema=None,
            missing=DEFAULT_MISSING_VALUES,
            allowed=LEGACY_TYPES,
        )
    start, raw_meta = split
    schema, missing, rows = _parse_meta(raw_meta, where)
    return _parse_canonical(
        _ViewReader(view[:start]),
        where=where,
        schema=schema,
        missing=missing,
        rows=rows,
        names=[name for name, _ in schema],
        native=start >= NATIVE_MIN_BYTES,
    )


def _parse_canonical(
    raw: io.RawIOBase,
    *,
    where: str,
    schema: list[tuple[str, str]],
    missing: tuple[str, ...],
    rows: int,
    names: list[str],
    native: bool = True,
) -> Table:
    """Parse the canonical CSV read from ``raw`` into arrays of ``rows`` rows for ``names``
    (``native``: let Arrow read quote-free blocks).

    Raises ``LoaderError`` if the header differs from ``schema``, a value does not fit its
    recorded type, or the row count differs from ``rows``.
    """
    header = [name for name, _ in schema]
    wanted = set(names)
    indices = [i for i, name in enumerate(header) if name in wanted]
    sinks = {i: _Sink(schema[i][1], rows, missing) for i in indices}
    numeric_markers = any(parses_as_float(marker) for marker in missing)
    shapes = [
        None
        if i not in sinks
        else "float"
        if kind in NUMERIC_TYPES and not numeric_markers
        else "dict"
        for i, (_, kind) in enumerate(schema)
    ]
    parsed = 0
    text = io.TextIOWrapper(
        io.BufferedReader(raw, 1 << 20), encoding="utf-8", errors="strict", newline=""
    )
    try:
        reader = RecordReader(
            text,
            block_chars=_NATIVE_BLOCK,
            native=(lambda: shapes) if native else None,
            markers=missing,
        )
        if reader.header != header:
            raise LoaderError(f"{where}: the header does not match the schema recorded at ingest")
        for batch in reader.batches():
            n = batch.n_rows
            if parsed + n <= rows:
                for i, sink in sinks.items():
                    sink.put(batch, i, parsed)
            parsed += n
    except CsvError as exc:
        raise LoaderError(f"{where}: {exc}") from None
    except UnicodeDecodeError:
        raise LoaderError(f"{where}: the dataset is not valid text") from None
    except ValueError:
        raise LoaderError(f"{where}: a value does not fit its column's recorded type") from None
    if parsed != rows:
        raise LoaderError(f"{where}: {parsed} rows parsed but {rows} recorded at ingest")
    return Table(
        columns=[header[i] for i in indices],
        data={header[i]: sinks[i].array for i in indices},
        types={header[i]: schema[i][1] for i in indices},
    )


_NATIVE_BLOCK = 1 << 20
# Below this payload size the Python rules are fast enough and the ClientApp (a new process per
# Flower message) does not pay the 0.3 s import of pyarrow.
NATIVE_MIN_BYTES = 4 << 20


class _Sink:
    """A preallocated array for one column of a known type, filled batch by batch: ``float64``
    for ``int``/``float`` (missing → ``nan``), ``datetime64[D]`` for ``date`` (missing →
    ``NaT``), ``object`` for ``bool`` (``True``/``False``/``None``) and ``str`` (``None`` for
    missing; equal strings of a batch share one object). A native batch is converted once per
    distinct cell (``sandbox.arrowcsv``), else cell by cell — both by the one rule of
    ``csvformat.column_values``. Raises ``ValueError`` for a value that does not fit the type."""

    def __init__(self, kind: str, rows: int, missing: tuple[str, ...]) -> None:
        self.kind = kind
        self.missing = frozenset(missing)
        if kind in NUMERIC_TYPES:
            self.array = np.empty(rows, dtype=np.float64)
        elif kind == "date":
            self.array = np.empty(rows, dtype="datetime64[D]")
        else:
            self.array = np.empty(rows, dtype=object)

    def put(self, batch, index: int, start: int) -> None:
        end = start + batch.n_rows
        cells = batch.array(index)
        if cells is not None:
            if arrowcsv.shape_of(cells) != "dict":
                self.array[start:end] = arrowcsv.numbers(cells)
            else:
                raw_values, positions = arrowcsv.dictionary(cells)
                self.array[start:end] = self._convert(raw_values)[positions]
            return
        self.array[start:end] = column_values(self.kind, batch.column(index), self.missing)

    def _convert(self, raw_values: list[str]) -> np.ndarray:
        """The column's value of each distinct raw cell (``csvformat.column_values``)."""
        values = column_values(self.kind, raw_values, self.missing)
        if isinstance(values, np.ndarray):
            return values
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out


def parse_table(
    text: str,
    *,
    where: str = "dataset",
    missing_values: Sequence[str] = DEFAULT_MISSING_VALUES,
    delimiter: str = ",",
) -> Table:
    """Parse CSV text into a ``Table``, inferring types with the ``sandbox.csvformat`` rules.

    Raises ``LoaderError`` for an invalid CSV.
    """
    return _parse(
        io.StringIO(text, newline=""),
        where=where,
        schema=None,
        missing=tuple(m.strip() for m in missing_values),
        allowed=TYPES,
        delimiter=delimiter,
    )


def _parse(
    stream,
    *,
    where: str,
    schema: list[tuple[str, str]] | None,
    missing: tuple[str, ...],
    allowed: tuple[str, ...],
    delimiter: str = ",",
) -> Table:
    marker_set = frozenset(missing)
    try:
        reader = RecordReader(stream, delimiter=delimiter)
        names = reader.header
        if schema is not None and names != [name for name, _ in schema]:
            raise LoaderError(f"{where}: the header does not match the schema recorded at ingest")
        builders: list[_Column] = [
            _Column(kind if schema is not None else None, marker_set)
            for kind in ([k for _, k in schema] if schema is not None else names)
        ]
        for batch in reader.batches():
            for builder, cells in zip(builders, batch.columns, strict=True):
                builder.add(cells)
    except CsvError as exc:
        raise LoaderError(f"{where}: {exc}") from None
    except UnicodeDecodeError:
        raise LoaderError(f"{where}: the dataset is not valid text") from None
    except ValueError:
        raise LoaderError(f"{where}: a value does not fit its column's recorded type") from None
    data: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    for name, builder in zip(names, builders, strict=True):
        try:
            types[name], data[name] = builder.finish(allowed)
        except ValueError:
            raise LoaderError(
                f"{where}: column {name!r} holds a value that is not of its recorded type"
            ) from None
    return Table(columns=list(names), data=data, types=types)


class _Column:
    """Builds one column's array batch by batch (``kind`` known: ``csvformat.column_values``) or
    at the end (inferred with ``csvformat.infer_kind``, the profile's rule)."""

    def __init__(self, kind: str | None, missing: frozenset[str]) -> None:
        self.kind = kind
        self.missing = missing
        self.parts: list[np.ndarray] = []
        self.values: list = []

    def add(self, cells: Sequence[str]) -> None:
        kind = self.kind
        if kind is None:
            self.values.extend(cells)
        elif kind in NUMERIC_TYPES or kind == "date":
            self.parts.append(column_values(kind, cells, self.missing))
        else:
            self.values.extend(column_values(kind, cells, self.missing))

    def finish(self, allowed: tuple[str, ...]) -> tuple[str, np.ndarray]:
        """``(type, array)``; raises ``ValueError`` if a value does not fit the type."""
        if self.kind is None:
            self.kind = self._infer(allowed)
            cells, self.values = self.values, []
            self.add(cells)
        kind = self.kind
        if kind in NUMERIC_TYPES:
            return kind, (np.concatenate(self.parts) if self.parts else np.empty(0))
        if kind == "date":
            return kind, (
                np.concatenate(self.parts) if self.parts else np.empty(0, dtype="datetime64[D]")
            )
        column = np.empty(len(self.values), dtype=object)
        column[:] = self.values
        return kind, column

    def _infer(self, allowed: tuple[str, ...]) -> str:
        kind = infer_kind({v for v in strip_all(self.values) if v not in self.missing})
        return kind if kind in allowed else "str"


def load_xy(
    table: Table,
    *,
    target: str,
    features: list[str] | None = None,
    classes: list[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Build ``X`` ``(n, d)`` float64 and ``y`` ``(n,)`` int64 for classification.

    ``features`` default to every numeric column except ``target``, in file order. Labels: a
    numeric target must hold integers and is cast as is; a string target is mapped to indices
    of ``classes`` if given, else of its own sorted unique values. Pass ``classes`` (the same
    list at every site) in a federated job: local sorted values differ between sites that lack
    a class.

    Raises ``LoaderError`` for a missing column, a non-numeric feature, missing values in a
    feature or the target, a non-integer numeric target, or a label not in ``classes``.
    """
    for name in [target, *(features or [])]:
        if name not in table.data:
            raise LoaderError(f"no column {name!r} in the dataset")
    if features is None:
        features = [name for name in table.numeric_columns() if name != target]
    if not features:
        raise LoaderError("no feature columns: no numeric column besides the target")
    if target in features:
        raise LoaderError(f"the target {target!r} cannot also be a feature")
    for name in features:
        if table.types.get(name) not in ("int", "float"):
            raise LoaderError(f"feature {name!r} is not numeric (type {table.types.get(name)})")
        missing = int(np.isnan(table.data[name]).sum())
        if missing:
            raise LoaderError(f"feature {name!r} has {missing} missing values")
    X = np.column_stack([table.data[name] for name in features]).astype(np.float64, copy=False)
    return X, _labels(table, target, classes)


def _labels(table: Table, target: str, classes: list[str] | None) -> np.ndarray:
    column = table.data[target]
    if table.types.get(target) in ("int", "float"):
        if np.isnan(column).any():
            raise LoaderError(f"target {target!r} has missing values")
        if not np.all(column == np.round(column)):
            raise LoaderError(f"target {target!r} has non-integer values: not a class label")
        return column.astype(np.int64)
    if any(value is None for value in column):
        raise LoaderError(f"target {target!r} has missing values")
    labels = list(classes) if classes is not None else sorted(set(column.tolist()))
    index = {label: i for i, label in enumerate(labels)}
    try:
        return np.array([index[value] for value in column], dtype=np.int64)
    except KeyError:
        raise LoaderError(f"target {target!r} has a label outside the given classes") from None


def train_test_split(
    X: np.ndarray, y: np.ndarray, *, test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Deterministic stratified split: ``(X_train, y_train, X_test, y_test)``.

    For each class ``c`` with ``n_c`` rows, ``round(n_c * test_fraction)`` rows chosen by a
    ``numpy.random.default_rng(seed)`` permutation go to test, clamped so a class with at least
    two rows keeps one row on each side (a single-row class stays in train). Rows keep their
    original order within each part. Same inputs and seed → same split.

    Raises ``ValueError`` if ``test_fraction`` is not in (0, 1) or ``X`` and ``y`` disagree in
    length.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} rows but y has {len(y)}")
    rng = np.random.default_rng(seed)
    test_mask = np.zeros(len(y), dtype=bool)
    for label in np.unique(y):
        rows = np.flatnonzero(y == label)
        n_test = int(round(len(rows) * test_fraction))
        n_test = 0 if len(rows) < 2 else min(max(n_test, 1), len(rows) - 1)
        test_mask[rng.permutation(rows)[:n_test]] = True
    return X[~test_mask], y[~test_mask], X[test_mask], y[test_mask]

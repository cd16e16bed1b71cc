"""Site-side CSV ingest: validate, type, profile and encrypt a dataset version (imports no Django).

Owns the CSV rules the sandbox shares with ``sandbox.loader`` (so both parse a file the same way):
UTF-8 (a leading byte-order mark is ignored), comma delimiter, ``"`` quoting (``csv`` module,
strict), a header row of unique non-empty names, every data row with as many fields as the
header, fully blank lines skipped. A cell is missing when it is empty after stripping
whitespace. Column types widen ``int`` → ``float`` → ``str`` as values are seen (ASCII decimal
integers; decimals with optional exponent; finite values only); a column with no value is ``str``.

``ingest_csv`` reads the file twice, in constant memory: pass 1 validates, infers types and
accumulates the profile (running sums, Welford 1962 "Note on a method for calculating corrected
sums of squares and products", Technometrics 4(3)); pass 2 streams the original bytes through
``sandbox.crypto.encrypt_stream`` into a temp file, which ``ObjectStore.put_file`` then stores
atomically. Both passes hash the plaintext, so a file changed between them is refused.

The profile holds no row and no rare value: counts 1..7 are shown as ``"≤7"``, larger counts
are rounded to the nearest 5, numeric summaries are rounded to 3 significant figures and
withheld when fewer than 8 values exist, and only categories seen more than 7 times are named
(at most 20).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import math
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from sandbox.crypto import KEY_BYTES, associated_data, encrypt_stream
from sandbox.storage import ObjectStore, validate_key

SMALL_COUNT = 7
SUPPRESSED = "≤7"
MAX_CATEGORIES = 20
MAX_TRACKED_DISTINCT = 10_000
MAX_CATEGORY_LENGTH = 100
ENCODING = "utf-8-sig"

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_TYPE_ORDER = {"int": 0, "float": 1, "str": 2}


class IngestError(Exception):
    """The CSV cannot be ingested; the message names the line (and column) where relevant."""


@dataclass(frozen=True)
class IngestResult:
    """What the portal records about a dataset version (metadata only, never rows).

    ``schema``: ``[{"name": str, "type": "int"|"float"|"str"}]`` in file order; ``size_bytes``
    and ``ciphertext_sha256`` describe the stored (encrypted) object; ``profile``: see
    ``compute_profile``.
    """

    store_key: str
    schema: list[dict]
    row_count: int
    size_bytes: int
    ciphertext_sha256: str
    profile: dict


def store_key_for(*, site: str, dataset: str, version: int) -> str:
    """Object key of a dataset version: ``"{site}/{dataset}/v{version}.csv.enc"``."""
    return f"{site}/{dataset}/v{version}.csv.enc"


def classify_value(value: str) -> str | None:
    """Type of one cell: ``None`` if missing (blank), else ``"int"``, ``"float"`` or ``"str"``."""
    text = value.strip()
    if not text:
        return None
    if _INT.fullmatch(text):
        return "int" if math.isfinite(float(text)) else "str"
    if _FLOAT.fullmatch(text):
        return "float" if math.isfinite(float(text)) else "str"
    return "str"


def widen(current: str | None, seen: str) -> str:
    """The narrower-or-equal common type of ``current`` (``None`` = nothing seen) and ``seen``."""
    if current is None:
        return seen
    return current if _TYPE_ORDER[current] >= _TYPE_ORDER[seen] else seen


def read_csv(stream: TextIO) -> tuple[list[str], Iterator[list[str]]]:
    """Parse the header of ``stream`` (opened with ``newline=""``); return it and a row iterator.

    The iterator yields data rows (lists of raw field strings, blank lines skipped) and raises
    ``IngestError`` on a ragged row (``"line 7: expected 31 fields, found 30"``), a CSV syntax
    error or invalid UTF-8. Raises ``IngestError`` now for an empty file or a bad header
    (empty or duplicate column names).
    """
    reader = csv.reader(stream, strict=True)
    try:
        header = next(reader, None)
    except (csv.Error, UnicodeDecodeError) as exc:
        raise _parse_error(reader, exc) from None
    if header is None:
        raise IngestError("empty file: a header row is required")
    names = [name.strip() for name in header]
    if not any(names):
        raise IngestError("line 1: the header row is empty")
    first_seen: dict[str, int] = {}
    for index, name in enumerate(names, start=1):
        if not name:
            raise IngestError(f"line 1, column {index}: empty column name")
        if name in first_seen:
            raise IngestError(
                f"line 1: duplicate column name {name!r} (columns {first_seen[name]} and {index})"
            )
        first_seen[name] = index
    return names, _rows(reader, len(names))


def _rows(reader, width: int) -> Iterator[list[str]]:
    while True:
        try:
            row = next(reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise _parse_error(reader, exc) from None
        if row is None:
            return
        if not row or (len(row) == 1 and not row[0].strip() and width > 1):
            continue
        if len(row) != width:
            raise IngestError(f"line {reader.line_num}: expected {width} fields, found {len(row)}")
        yield row


def _parse_error(reader, exc: Exception) -> IngestError:
    if isinstance(exc, UnicodeDecodeError):
        return IngestError(f"near line {reader.line_num + 1}: not valid UTF-8 ({exc.reason})")
    return IngestError(f"line {reader.line_num}: {exc}")


@dataclass
class ColumnStats:
    """Running summary of one column (constant memory apart from bounded category counts)."""

    name: str
    type: str | None = None
    missing: int = 0
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    categories: dict[str, int] | None = field(default_factory=dict)

    def add(self, raw: str) -> None:
        """Account one cell (raw text)."""
        kind = classify_value(raw)
        if kind is None:
            self.missing += 1
            return
        value = raw.strip()
        self.count += 1
        if self.categories is not None:
            if len(value) > MAX_CATEGORY_LENGTH:
                self.categories = None
            else:
                self.categories[value] = self.categories.get(value, 0) + 1
                if len(self.categories) > MAX_TRACKED_DISTINCT:
                    self.categories = None
        self.type = widen(self.type, kind)
        if self.type != "str":
            number = float(value)
            delta = number - self.mean
            self.mean += delta / self.count
            self.m2 += delta * (number - self.mean)
            self.min = min(self.min, number)
            self.max = max(self.max, number)

    @property
    def final_type(self) -> str:
        return self.type or "str"


def safe_count(n: int) -> int | str:
    """Disclosure-controlled count: 0 stays 0, 1..7 → ``"≤7"``, else rounded to the nearest 5."""
    if n == 0:
        return 0
    if n <= SMALL_COUNT:
        return SUPPRESSED
    return (n + 2) // 5 * 5


def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


def compute_profile(columns: list[ColumnStats], row_count: int) -> dict:
    """Build the suppressed profile from running column summaries.

    Returns ``{"format": 1, "rows": safe_count(row_count), "columns": [per column]}``; each
    column: ``{"name", "type", "missing", "count"}`` (``safe_count``) plus, for ``int``/``float``,
    ``"mean", "std"`` (sample, n-1), ``"min", "max"`` to 3 significant figures (``None`` when
    fewer than 8 values), and for ``str`` ``"categories": [{"value", "count"}]`` — only values
    seen more than 7 times, at most 20, most frequent first — and ``"other"`` (``safe_count`` of
    the remaining values); ``"categories"``/``"other"`` are ``None`` for free-text columns with
    more than 10 000 distinct or over-long values. A list, not a dict, so order survives jsonb.
    """
    out = []
    for col in columns:
        entry: dict = {
            "name": col.name,
            "type": col.final_type,
            "missing": safe_count(col.missing),
            "count": safe_count(col.count),
        }
        if col.final_type in ("int", "float"):
            enough = col.count > SMALL_COUNT
            std = math.sqrt(col.m2 / (col.count - 1)) if col.count > 1 else 0.0
            summary = {"mean": col.mean, "std": std, "min": col.min, "max": col.max}
            for key, value in summary.items():
                entry[key] = _sig3(value) if enough else None
        elif col.categories is None:
            entry["categories"] = None
            entry["other"] = None
        else:
            frequent = sorted(
                ((v, c) for v, c in col.categories.items() if c > SMALL_COUNT),
                key=lambda item: (-item[1], item[0]),
            )[:MAX_CATEGORIES]
            entry["categories"] = [{"value": v, "count": safe_count(c)} for v, c in frequent]
            entry["other"] = safe_count(col.count - sum(c for _, c in frequent))
        out.append(entry)
    return {"format": 1, "rows": safe_count(row_count), "columns": out}


class _HashingReader(io.RawIOBase):
    """Raw binary reader that hashes (SHA-256) and counts every byte read from ``inner``."""

    def __init__(self, inner: BinaryIO) -> None:
        super().__init__()
        self._inner = inner
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._inner.read(len(buffer))
        buffer[: len(data)] = data
        self.digest.update(data)
        self.size += len(data)
        return len(data)


def ingest_csv(
    path: Path,
    *,
    site: str,
    dataset: str,
    version: int,
    store: ObjectStore,
    kek: bytes,
    tmp_dir: Path | None = None,
) -> IngestResult:
    """Validate, profile and encrypt the CSV at ``path`` into ``store`` as one dataset version.

    Stores the original CSV bytes encrypted (``sandbox.crypto``, associated data from ``site``,
    ``dataset``, ``version``) under ``store_key_for(...)``. ``tmp_dir`` holds the ciphertext
    while it is written (default: the system temp dir); the temp file is always removed.
    Atomic: on any failure nothing is stored. Memory is constant in the file size (bounded
    category counts aside).

    Raises ``IngestError`` for a bad CSV (empty file, no data rows, bad header, ragged row,
    invalid UTF-8, syntax error), an invalid site/dataset (slugs: letters, digits, ``-``,
    ``_``) or version or KEK, an existing object
    (versions are immutable) or a file changed during ingest; ``StorageError`` if the store
    fails; ``OSError`` if ``path`` cannot be read.
    """
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise IngestError(f"dataset version must be a non-negative integer, got {version!r}")
    for what, name in (("site", site), ("dataset", dataset)):
        if not isinstance(name, str) or not _SLUG.fullmatch(name):
            raise IngestError(
                f"invalid {what} name {name!r}: use letters, digits, '-' and '_' (at most 100)"
            )
    store_key = store_key_for(site=site, dataset=dataset, version=version)
    validate_key(store_key)
    if not isinstance(kek, bytes | bytearray) or len(kek) != KEY_BYTES:
        raise IngestError(f"the site key must be {KEY_BYTES} bytes")
    if store.exists(store_key):
        raise IngestError(
            f"{store_key} already exists in {store.url}: dataset versions are immutable"
        )

    # Pass 1: validate, infer types, profile.
    with open(path, "rb") as raw:
        hashed = _HashingReader(raw)
        text = io.TextIOWrapper(io.BufferedReader(hashed), encoding=ENCODING, newline="")
        names, rows = read_csv(text)
        stats = [ColumnStats(name=name) for name in names]
        row_count = 0
        for row in rows:
            row_count += 1
            for col, cell in zip(stats, row, strict=True):
                col.add(cell)
        plain_sha256, plain_size = hashed.digest.hexdigest(), hashed.size
    if row_count == 0:
        raise IngestError("no data rows after the header")

    # Pass 2: encrypt the same bytes into a temp file, then store atomically.
    aad = associated_data(site=site, dataset=dataset, version=version)
    fd, tmp_name = tempfile.mkstemp(prefix=".frp-ingest-", suffix=".enc", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as sink, open(path, "rb") as raw:
            hashed = _HashingReader(raw)
            result = encrypt_stream(kek=kek, aad=aad, source=io.BufferedReader(hashed), sink=sink)
            sink.flush()
            os.fsync(sink.fileno())
        if (hashed.digest.hexdigest(), hashed.size) != (plain_sha256, plain_size):
            raise IngestError(f"{Path(path).name} changed during ingest; ingest it again")
        store.put_file(store_key, Path(tmp_name))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)

    return IngestResult(
        store_key=store_key,
        schema=[{"name": col.name, "type": col.final_type} for col in stats],
        row_count=row_count,
        size_bytes=result.ciphertext_bytes,
        ciphertext_sha256=result.sha256,
        profile=compute_profile(stats, row_count),
    )

"""Site-side CSV ingest: validate, type, profile and encrypt a dataset version (imports no Django).

Owns turning a steward's CSV file into one encrypted, immutable dataset version plus the
metadata the portal may see (schema, counts, a disclosure-controlled profile). The CSV rules —
encodings, delimiters, quoting, missing-value markers, types — live in ``sandbox.csvformat``,
shared with ``sandbox.loader``; the column statistics and the disclosure-controlled profile live in
``sandbox.profile``.

**One streaming pass, constant memory.** ``ingest_csv`` reads the file once, in blocks of whole
lines (``csvformat.RecordReader``). The native path (default, needs ``pyarrow``; see
``sandbox.arrowcsv``) hands a block of about 1 M characters without any ``"`` to Arrow's CSV
parser, asking for each column what its type so far allows — ``int64``/``float64`` for a
numeric column, dictionary-encoded text otherwise — so numbers are converted in C++ and each
distinct text value is typed, stripped and counted once in Python (``ColumnStats.add_native``).
Whatever Arrow cannot show to be exactly what the Python rules give (a block with quotes, a
ragged line, a value that changes a column's type or breaks an override, ``nan``, a numeric
missing-value marker) goes through the Python path for that block or column: blocks of about
256 K characters, ``str.split`` or the ``csv`` module, whole-column operations in
``ColumnStats.add_batch``. Both paths give the same payload bytes, schema, profile and error
messages (``tests/sandbox/test_arrowcsv.py``); ``native=False`` forces the Python path. The
canonical text of each block is encrypted straight away (``sandbox.crypto.encrypt_stream``) into
a temp file of ciphertext, which ``ObjectStore.put_file`` stores atomically at the end. Memory
is one block (about 10 bytes per character on the native path) plus bounded category counts,
whatever the file size; no plaintext touches disk.

**What is stored** (the plaintext inside the encrypted object)::

    payload = canonical CSV || meta JSON || u32 len(meta) || b"\\n#FRP-CANONICAL-CSV/1\\n"

The canonical CSV is UTF-8 without a byte-order mark, comma-delimited, ``"``-quoted: a
comma-delimited source is its decoded text re-encoded as UTF-8 (records, quoting and line ends
as in the file), any other source is re-written with ``csv.writer`` (``\\n`` line ends). The
``meta`` trailer (``{"format": "frp-csv/1", "columns": [{"name", "type"}], "missing_values":
[...], "rows": n}``) is what the loader needs to rebuild typed columns without knowing the
source's encoding or delimiter; it sits at the end because types are known only after the last
row, and it is authenticated with the rest. Objects stored before this format (the original CSV
bytes, no trailer) are still read by the loader with the old rules.

**The profile** holds no row and no rare value, following the output-checking ("SDC") rules of
trusted research environments — the suppression and rounding OpenSAFELY applies to every
released count (counts of 1..7 redacted, the rest rounded to the nearest 5; its
``redact_small_numbers(n=7, rounding_base=5)``), in the spirit of the UK SDAP "Statistical
Disclosure Control handbook for TREs" (Griffiths et al. 2019): every count ``c`` is shown as
``0`` if ``c == 0``, ``"≤7"`` if ``1 <= c <= 7``, else ``c`` rounded to the nearest multiple of
5 (``safe_count``); a category is named only when more than 7 rows hold it; numeric summaries
are rounded to 3 significant figures and withheld when 7 or fewer values exist; date columns
show only the first and last year. Running sums follow Welford 1962 ("Note on a method for
calculating corrected sums of squares and products", Technometrics 4(3)) merged per batch with
Chan, Golub & LeVeque 1979 ("Updating formulae and a pairwise algorithm for computing sample
variances", Stanford CS tech. report STAN-CS-79-773).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TextIO

from sandbox import arrowcsv
from sandbox.crypto import KEY_BYTES, associated_data, encrypt_stream
from sandbox.csvformat import (
    BLOCK_CHARS,
    DEFAULT_MAX_COLUMNS,
    DEFAULT_MAX_LINE_CHARS,
    DEFAULT_MISSING_VALUES,
    PAYLOAD_FORMAT,
    SAMPLE_BYTES,
    TYPES,
    CellError,
    CsvError,
    RecordReader,
    check_delimiter,
    classify_value,
    decode_sample,
    describe_type,
    detect_delimiter,
    encode_trailer,
    locate_decode_error,
    normalise_missing,
    parses_as_float,
    resolve_encoding,
    widen,
)
from sandbox.profile import ColumnStats, compute_profile, safe_count
from sandbox.storage import ObjectStore, validate_key

__all__ = [
    "ColumnStats",
    "IngestError",
    "IngestResult",
    "classify_value",
    "compute_profile",
    "ingest_csv",
    "read_csv",
    "safe_count",
    "store_key_for",
    "widen",
]

ENCODING = "utf-8-sig"  # how objects stored before the canonical format are decoded

_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")
_READ_BLOCK = 1 << 20
NATIVE_BLOCK_CHARS = 1 << 20  # text per native block: ~10 bytes of memory per character


class IngestError(Exception):
    """The CSV cannot be ingested; the message names the line (and column) where relevant."""


@dataclass(frozen=True)
class IngestResult:
    """What the portal records about a dataset version (metadata only, never rows).

    ``schema``: ``[{"name": str, "type": "int"|"float"|"bool"|"date"|"str"}]`` in file order;
    ``size_bytes`` and ``ciphertext_sha256`` describe the stored (encrypted) object;
    ``profile``: see ``compute_profile``. How the source was read: ``encoding`` (Python codec
    name, e.g. ``"utf-8"``, ``"utf-8-sig"``, ``"utf-16"``, ``"cp1252"``) and
    ``encoding_source`` (``"declared"``, ``"bom"`` or ``"detected"``); ``delimiter``
    (``","``, ``";"`` or ``"\\t"``) and ``delimiter_source`` (``"declared"``, ``"detected"`` or
    ``"fallback"``); ``missing_values`` (the markers applied, stripped). ``source_bytes`` and
    ``source_sha256`` identify the file that was read. The schema and markers are also stored
    inside the encrypted object (module doc), so the loader needs none of these. ``warnings``:
    for the steward only (they may name values of the file), e.g. a column read as text because
    of values that look like undeclared missing-value markers.
    """

    store_key: str
    schema: list[dict]
    row_count: int
    size_bytes: int
    ciphertext_sha256: str
    profile: dict
    encoding: str = "utf-8"
    encoding_source: str = "detected"
    delimiter: str = ","
    delimiter_source: str = "detected"
    missing_values: tuple[str, ...] = DEFAULT_MISSING_VALUES
    source_bytes: int = 0
    source_sha256: str = ""
    warnings: tuple[str, ...] = ()


def store_key_for(*, site: str, dataset: str, version: int) -> str:
    """Object key of a dataset version: ``"{site}/{dataset}/v{version}.csv.enc"``."""
    return f"{site}/{dataset}/v{version}.csv.enc"


def read_csv(stream: TextIO, *, delimiter: str = ",") -> tuple[list[str], Iterator[list[str]]]:
    """Parse the header of ``stream`` (opened with ``newline=""``); return it and a row iterator.

    The iterator yields data rows (lists of raw field strings, blank lines skipped) and raises
    ``IngestError`` on a ragged row (``"line 7: expected 31 fields, found 30"``, the physical
    line where the record starts) or a CSV syntax error. Raises ``IngestError`` now for an
    empty file or a bad header (empty or duplicate column names).
    """
    try:
        reader = RecordReader(stream, delimiter=delimiter)
    except CsvError as exc:
        raise IngestError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise IngestError(f"line 1: the text cannot be decoded ({exc.reason})") from None

    def rows() -> Iterator[list[str]]:
        try:
            for batch in reader.batches():
                yield from batch.rows
        except CsvError as exc:
            raise IngestError(str(exc)) from None
        except UnicodeDecodeError as exc:
            raise IngestError(f"the text cannot be decoded ({exc.reason})") from None

    return reader.header, rows()


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
        n = self._inner.readinto(buffer)
        self.digest.update(memoryview(buffer)[:n])
        self.size += n
        return n


class _BlockReader:
    """A ``read(size)`` stream over an iterator of byte blocks (what ``encrypt_stream`` pulls)."""

    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks = blocks
        self._head = b""  # the block being read, from offset _pos
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        parts: list = []
        have = 0
        while size < 0 or have < size:
            left = len(self._head) - self._pos
            if left <= 0:
                self._head = next(self._blocks, None)
                self._pos = 0
                if self._head is None:
                    self._head = b""
                    break
                continue
            take = left if size < 0 else min(left, size - have)
            if take == len(self._head):
                parts.append(self._head)
            else:
                parts.append(memoryview(self._head)[self._pos : self._pos + take])
            self._pos += take
            have += take
        return b"".join(parts)


@dataclass
class _Outcome:
    schema: list[dict] = field(default_factory=list)
    profile: dict = field(default_factory=dict)
    row_count: int = 0
    warnings: list[str] = field(default_factory=list)


def _canonical_payload(
    text: TextIO,
    *,
    delimiter: str,
    missing: tuple[str, ...],
    overrides: dict[str, str],
    outcome: _Outcome,
    native: bool = True,
    max_columns: int | None = DEFAULT_MAX_COLUMNS,
    max_line_chars: int | None = DEFAULT_MAX_LINE_CHARS,
) -> Iterator[bytes]:
    """Yield the plaintext payload (module doc) block by block while validating and profiling.

    Fills ``outcome`` once the last block (the trailer) has been produced. Raises
    ``IngestError``, ``CsvError`` or ``UnicodeDecodeError`` (the caller adds the location).
    """
    pending: list[str] = []
    passthrough = delimiter == ","
    native = native and arrowcsv.AVAILABLE
    stats: list[ColumnStats] = []
    numeric_markers = any(parses_as_float(marker) for marker in missing)
    reader = RecordReader(
        text,
        delimiter=delimiter,
        tee=pending.append if passthrough else None,
        block_chars=NATIVE_BLOCK_CHARS if native else BLOCK_CHARS,
        native=(lambda: [col.native_shape(numeric_markers) for col in stats]) if native else None,
        markers=missing,
        max_columns=max_columns,
        max_line_chars=max_line_chars,
    )
    names = reader.header
    unknown = [name for name in overrides if name not in names]
    if unknown:
        raise IngestError(
            f"type override for column(s) not in the header: {', '.join(unknown)} "
            f"(the header has: {', '.join(names[:20])}{' …' if len(names) > 20 else ''})"
        )
    stats.extend(ColumnStats(name=name, declared=overrides.get(name)) for name in names)
    marker_set = frozenset(missing)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if not passthrough:
        writer.writerow(names)
        yield _take(out).encode("utf-8")
    rows = 0
    for batch in reader.batches():
        neg_zero = _NegZero(batch)
        for index, col in enumerate(stats):
            array = batch.array(index)
            if array is not None and col.add_native(array, marker_set, neg_zero):
                continue
            try:
                col.add_batch(batch.column(index), marker_set)
            except CellError as exc:
                raise IngestError(
                    f"line {batch.line_of(exc.index)}, column {col.name!r}: value is not "
                    f"{describe_type(exc.expected)} (the column's declared type is "
                    f"{exc.expected!r})"
                ) from None
        rows += batch.n_rows
        if passthrough:
            if batch.native and len(pending) == 1 and pending[0] is batch.text:
                pending.clear()
                yield batch.data  # the block's text, already encoded
                continue
            chunk = "".join(pending)
            pending.clear()
        elif batch.native and "," not in batch.text:
            chunk = _rejoin(batch.text, delimiter)
        else:
            writer.writerows(batch.rows)
            chunk = _take(out)
        yield chunk.encode("utf-8")
    if pending:
        yield "".join(pending).encode("utf-8")
    if rows == 0:
        raise IngestError("no data rows after the header")
    schema = [{"name": col.name, "type": col.final_type} for col in stats]
    meta = {
        "format": PAYLOAD_FORMAT,
        "columns": schema,
        "missing_values": list(missing),
        "rows": rows,
    }
    outcome.schema = schema
    outcome.profile = compute_profile(stats, rows)
    outcome.row_count = rows
    outcome.warnings = [w for col in stats if (w := text_column_warning(col, missing))]
    yield encode_trailer(json.dumps(meta, ensure_ascii=False).encode("utf-8"))


def text_column_warning(col: ColumnStats, missing: Sequence[str]) -> str:
    """The steward's warning for a column read as text although most of its values are numbers
    (``ColumnStats.numeric_but_text``), naming the values that are not and their count; ``""``
    for any other column."""
    found = col.numeric_but_text()
    if found is None:
        return ""
    cells, values = found
    shown = ", ".join(f"{value!r} ({count})" for value, count in values[:5])
    more = f" and {len(values) - 5} more" if len(values) > 5 else ""
    declared = ", ".join(repr(m) for m in missing) or "none"
    return (
        f"column {col.name!r} is read as text because {cells} cell(s) are not numbers: "
        f"{shown}{more}. If they mean 'missing', declare them as missing-value markers "
        f"(declared now: {declared}) or give the column a type."
    )


class _NegZero:
    """Whether a native batch's text may hold a ``-0`` cell (searched once, when first asked)."""

    def __init__(self, batch) -> None:
        self._batch = batch
        self._found: bool | None = None

    def __call__(self) -> bool:
        if self._found is None:
            self._found = arrowcsv.NEG_ZERO.search(self._batch.text) is not None
        return self._found


def _take(out: io.StringIO) -> str:
    """The text written to ``out`` so far; ``out`` is emptied."""
    text = out.getvalue()
    out.seek(0)
    out.truncate()
    return text


_BLANK_LINES = re.compile(r"\n\n+")


def _rejoin(text: str, delimiter: str) -> str:
    """What ``csv.writer`` (comma, ``\\n`` line ends) writes for the records of ``text``: whole
    lines without any ``"`` or ``,``, every line of the header's width or blank (a native
    batch). No field then needs quoting, so a record is its line with ``delimiter`` replaced;
    blank lines are dropped and every record ends with ``\\n``."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\n\n" in text:
        text = _BLANK_LINES.sub("\n", text)
    text = text.removeprefix("\n")
    if not text.endswith("\n"):
        text += "\n"
    return text.replace(delimiter, ",")


def _check_override(schema_override: Mapping[str, str] | None) -> dict[str, str]:
    if schema_override is None:
        return {}
    if not isinstance(schema_override, Mapping):
        raise IngestError('schema_override must map column names to types, e.g. {"zip": "str"}')
    out: dict[str, str] = {}
    for name, kind in schema_override.items():
        if not isinstance(name, str) or kind not in TYPES:
            raise IngestError(
                f"schema_override[{name!r}] = {kind!r}: the type must be one of {list(TYPES)}"
            )
        out[name.strip()] = kind
    return out


def _file_blocks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as raw:
        while block := raw.read(_READ_BLOCK):
            yield block


def ingest_csv(
    path: Path,
    *,
    site: str,
    dataset: str,
    version: int,
    store: ObjectStore,
    kek: bytes,
    tmp_dir: Path | None = None,
    encoding: str | None = None,
    delimiter: str | None = None,
    missing_values: Sequence[str] = DEFAULT_MISSING_VALUES,
    schema_override: Mapping[str, str] | None = None,
    native: bool = True,
    max_columns: int | None = DEFAULT_MAX_COLUMNS,
    max_line_chars: int | None = DEFAULT_MAX_LINE_CHARS,
) -> IngestResult:
    """Validate, type, profile and encrypt the CSV at ``path`` into ``store`` as one version.

    ``encoding`` (a Python codec name) and ``delimiter`` (``","``, ``";"`` or ``"\\t"``) are
    detected when not given (``sandbox.csvformat``); ``missing_values`` are the dataset's
    missing-value markers (default only ``""``: declare ``("", "NA")`` to treat ``NA`` as
    missing); ``schema_override`` maps column names to a type (``"int"``, ``"float"``,
    ``"bool"``, ``"date"``, ``"str"``) that replaces inference, and every value must fit it.

    Stores the canonical payload (module doc) encrypted (``sandbox.crypto``, associated data
    from ``site``, ``dataset``, ``version``) under ``store_key_for(...)``. ``tmp_dir`` holds
    the ciphertext while it is written (default: the system temp dir); the temp file is
    always removed. ``native=False`` skips the Arrow fast path (module doc; same results).
    ``max_columns`` and ``max_line_chars`` bound the header's columns and every physical line's
    characters (``None``: no limit), checked while streaming: a 100,000-column header or a
    300 MB line is refused at once, with the limit named, not held in memory.
    One pass over the file; memory is constant in the file size. Atomic: on any failure
    nothing is stored.

    Raises ``IngestError`` for a bad CSV — empty file, no data rows, bad header, ragged row,
    unclosed quote, undecodable bytes, a value that does not fit its override; the message
    names the physical line and, where there is one, the column — for bad arguments (site/
    dataset slugs: letters, digits, ``-``, ``_``; version; KEK; encoding; delimiter; missing
    values; override types or unknown override columns) and for an existing object (versions
    are immutable); ``StorageError`` if the store fails; ``OSError`` if ``path`` cannot be
    read.
    """
    store_key, overrides, missing = _checked_arguments(
        site=site,
        dataset=dataset,
        version=version,
        kek=kek,
        schema_override=schema_override,
        missing_values=missing_values,
        delimiter=delimiter,
    )
    source = _source_format(Path(path), encoding=encoding, delimiter=delimiter)
    if store.exists(store_key):
        raise IngestError(
            f"{store_key} already exists in {store.url}: dataset versions are immutable"
        )
    outcome, encrypted, hashed = _encrypt_into_store(
        Path(path),
        source,
        store=store,
        store_key=store_key,
        kek=kek,
        aad=associated_data(site=site, dataset=dataset, version=version),
        missing=missing,
        overrides=overrides,
        native=native,
        max_columns=max_columns,
        max_line_chars=max_line_chars,
        tmp_dir=tmp_dir,
    )
    return IngestResult(
        store_key=store_key,
        schema=outcome.schema,
        row_count=outcome.row_count,
        size_bytes=encrypted.ciphertext_bytes,
        ciphertext_sha256=encrypted.sha256,
        profile=outcome.profile,
        encoding=source.codec,
        encoding_source=source.encoding_source,
        delimiter=source.delimiter,
        delimiter_source=source.delimiter_source,
        missing_values=missing,
        source_bytes=hashed.size,
        source_sha256=hashed.digest.hexdigest(),
        warnings=tuple(outcome.warnings),
    )


# The steps of ``ingest_csv``.


def _checked_arguments(
    *, site, dataset, version, kek, schema_override, missing_values, delimiter
) -> tuple[str, dict[str, str], tuple[str, ...]]:
    """``(store key, type overrides, missing-value markers)`` of valid arguments; else
    ``IngestError`` naming the bad one."""
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
    overrides = _check_override(schema_override)
    try:
        missing = normalise_missing(missing_values)
        if delimiter is not None:
            check_delimiter(delimiter)
    except CsvError as exc:
        raise IngestError(str(exc)) from None
    return store_key, overrides, missing


@dataclass(frozen=True)
class _Source:
    """How the source file is read: its codec and delimiter, and where each came from."""

    codec: str
    encoding_source: str
    delimiter: str
    delimiter_source: str


def _source_format(path: Path, *, encoding: str | None, delimiter: str | None) -> _Source:
    """The encoding (declared, byte-order mark or detected) and delimiter (declared or detected)
    from the file's first ``SAMPLE_BYTES``. Raises ``IngestError``, ``OSError``."""
    with open(path, "rb") as raw:
        sample = raw.read(SAMPLE_BYTES)
    try:
        codec, encoding_source = resolve_encoding(encoding, sample)
    except CsvError as exc:
        raise IngestError(str(exc)) from None
    if delimiter is None:
        delimiter, delimiter_source = detect_delimiter(decode_sample(sample, codec))
    else:
        delimiter_source = "declared"
    return _Source(codec, encoding_source, delimiter, delimiter_source)


def _encrypt_into_store(
    path: Path,
    source: _Source,
    *,
    store: ObjectStore,
    store_key: str,
    kek: bytes,
    aad: bytes,
    missing: tuple[str, ...],
    overrides: dict[str, str],
    native: bool,
    max_columns: int | None,
    max_line_chars: int | None,
    tmp_dir: Path | None,
):
    """One pass: read, validate, profile and encrypt the file into a temp file of ciphertext,
    then store it atomically at ``store_key``. Returns ``(outcome, encryption result, hashing
    reader of the source)``. The temp file is always removed. Raises ``IngestError``."""
    outcome = _Outcome()
    fd, tmp_name = tempfile.mkstemp(prefix=".frp-ingest-", suffix=".enc", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as sink, open(path, "rb") as raw:
            hashed = _HashingReader(raw)
            text = io.TextIOWrapper(
                io.BufferedReader(hashed, _READ_BLOCK),
                encoding=source.codec,
                errors="strict",
                newline="",
            )
            payload = _canonical_payload(
                text,
                delimiter=source.delimiter,
                missing=missing,
                overrides=overrides,
                outcome=outcome,
                native=native,
                max_columns=max_columns,
                max_line_chars=max_line_chars,
            )
            result = encrypt_stream(kek=kek, aad=aad, source=_BlockReader(payload), sink=sink)
            sink.flush()
            os.fsync(sink.fileno())
        store.put_file(store_key, Path(tmp_name))
    except CsvError as exc:
        raise IngestError(str(exc)) from None
    except UnicodeDecodeError as exc:
        raise IngestError(_decode_error(path, source, exc)) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
    return outcome, result, hashed


def _decode_error(path: Path, source: _Source, exc: UnicodeDecodeError) -> str:
    """The message for bytes that do not decode: where, why, and what to declare."""
    codec = source.codec
    where = locate_decode_error(_file_blocks(path), codec, source.delimiter)
    if source.encoding_source == "declared":
        hint = ""
    elif codec == "cp1252":
        hint = "; the file is neither UTF-8 nor cp1252: declare its encoding"
    else:
        hint = "; declare the file's encoding (e.g. encoding='cp1252')"
    return (
        f"{where}: bytes that are not valid {codec} ({exc.reason}; encoding "
        f"{source.encoding_source}){hint}"
    )

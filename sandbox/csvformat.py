"""CSV rules shared by the sandbox ingest and loader (site-side, imports no Django).

Owns how the sandbox reads a real-world CSV, so ``sandbox.ingest`` and ``sandbox.loader`` parse a
file the same way:

* **Encoding**: declared by the caller, or detected — a byte-order mark selects ``utf-8-sig``,
  ``utf-16`` or ``utf-32``; otherwise the first ``SAMPLE_BYTES`` must decode as strict UTF-8
  (``utf-8``), else the file is read as ``cp1252`` (a superset of the printable Latin-1 range,
  what spreadsheet software on Windows writes). Decoding is always strict: a byte that does not
  decode later in the file is an error naming its line, never a silent replacement.
* **Delimiter**: ``,``, ``;`` or tab — declared, or detected with ``csv.Sniffer`` restricted to
  those three on the decoded sample; when the sniffer cannot decide the fallback is ``,``.
* **Records**: ``"`` quoting with doubled quotes, quoted fields may hold delimiters and line
  breaks, ``\\n``, ``\\r\\n`` or ``\\r`` line ends (``csv`` module, strict). A header row of
  unique non-empty names (surrounding whitespace and a leading U+FEFF removed), then data rows
  with exactly as many fields as the header; blank lines are skipped. Line numbers are physical
  lines of the file, counting the line breaks inside quoted fields.
* **Values**: compared after stripping surrounding whitespace. A value is missing when it equals
  one of the dataset's declared missing-value markers (default: only ``""``), so a country code
  ``NA`` stays a value unless ``"NA"`` is declared.
* **Types** (``classify_value``): ``int`` (ASCII decimal integer with optional sign), ``float``
  (decimal with optional fraction and exponent; finite), ``bool`` (``true``/``false``, any
  case), ``date`` (ISO 8601 calendar date ``YYYY-MM-DD``), else ``str``. A column's type is the
  common type of its values: ``int`` widens to ``float``, any other mix is ``str``; a column
  with no value is ``str``. A steward may override a column's type; every value must then fit
  it (``float`` accepts integers, ``str`` accepts everything).

The functions here are pure; I/O errors and ``CsvError`` propagate to the caller, which adds
its own context (``IngestError``, ``LoaderError``).
"""

from __future__ import annotations

import codecs
import csv
import datetime as dt
import io
import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TextIO

import numpy as np

from sandbox import arrowcsv

DELIMITERS = (",", ";", "\t")
DELIMITER_NAMES = {",": "comma", ";": "semicolon", "\t": "tab"}  # the delimiters in words
DEFAULT_DELIMITER = ","
DEFAULT_MISSING_VALUES = ("",)
TYPES = ("int", "float", "bool", "date", "str")
NUMERIC_TYPES = ("int", "float")
SAMPLE_BYTES = 64 * 1024
BLOCK_CHARS = 256 * 1024  # text per block: small enough for a low peak RSS, large for speed
MAX_FIELD_CHARS = 16 * 1024 * 1024

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_BOOLS = frozenset({"true", "false"})
_ORDER = {"int": 0, "float": 1}
_ASCII_SPACE = (" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f")

# A type accepts the values classified as these kinds (for a steward's override).
ACCEPTS = {
    "int": frozenset({"int"}),
    "float": frozenset({"int", "float"}),
    "bool": frozenset({"bool"}),
    "date": frozenset({"date"}),
    "str": frozenset(TYPES),
}
_DESCRIBE = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "date": "a date (YYYY-MM-DD)",
    "str": "text",
}

csv.field_size_limit(MAX_FIELD_CHARS)


class CsvError(Exception):
    """The text is not a CSV the sandbox accepts; the message names the line (and column)."""


class CellError(Exception):
    """A value of a batch does not fit its column's declared type (``index`` into the batch)."""

    def __init__(self, index: int, expected: str) -> None:
        super().__init__(f"value is not {_DESCRIBE[expected]}")
        self.index = index
        self.expected = expected


# --- encoding and delimiter ----------------------------------------------------------------------


def resolve_encoding(declared: str | None, sample: bytes) -> tuple[str, str]:
    """The codec to decode a file with, and how it was chosen: ``(codec, source)``.

    ``source`` is ``"declared"``, ``"bom"`` or ``"detected"``. A declared UTF-8 file that starts
    with a byte-order mark is read as ``utf-8-sig`` so the mark does not become part of the
    first column name. Raises ``CsvError`` for an unknown codec name, and for a sample full of
    NUL bytes without a BOM (UTF-16/32 without a mark: it must be declared, e.g.
    ``"utf-16-le"``).
    """
    if declared is not None:
        try:
            name = codecs.lookup(declared).name
        except (LookupError, TypeError):
            raise CsvError(f"unknown encoding {declared!r}") from None
        if name == "utf-8" and sample.startswith(codecs.BOM_UTF8):
            name = "utf-8-sig"
        return name, "declared"
    if sample.startswith(codecs.BOM_UTF8):
        return "utf-8-sig", "bom"
    if sample.startswith((codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        return "utf-32", "bom"
    if sample.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16", "bom"
    if sample.count(0) > len(sample) // 4:
        raise CsvError(
            "the file looks like UTF-16 or UTF-32 without a byte-order mark: declare its "
            "encoding (e.g. encoding='utf-16-le')"
        )
    try:
        codecs.getincrementaldecoder("utf-8")("strict").decode(sample, final=False)
    except UnicodeDecodeError:
        return "cp1252", "detected"
    return "utf-8", "detected"


def decode_sample(sample: bytes, encoding: str) -> str:
    """Decode the leading ``sample`` bytes (possibly cut mid-character) and cut at the last line
    break so only whole lines remain (all of it if it has no line break). Decoding errors are
    ignored here: the streaming pass reports them with their line."""
    text = codecs.getincrementaldecoder(encoding)("replace").decode(sample, final=False)
    text = text.removeprefix("\ufeff")
    cut = max(text.rfind("\n"), text.rfind("\r"))
    return text[: cut + 1] if cut >= 0 else text


def _consistent_width(sample_text: str, delimiter: str) -> int:
    """Columns per row when every complete row of the sample parses (quotes, embedded newlines)
    with ``delimiter`` into the header's width and that width is at least 2; else 0."""
    try:
        rows = [r for r in csv.reader(io.StringIO(sample_text), delimiter=delimiter) if r]
    except csv.Error:
        return 0
    if sample_text and sample_text[-1] not in "\r\n" and len(rows) > 1:
        rows.pop()  # the sample may end inside its last row
    width = len(rows[0]) if rows else 0
    return width if width >= 2 and all(len(r) == width for r in rows) else 0


def detect_delimiter(sample_text: str) -> tuple[str, str]:
    """``(delimiter, source)`` for the decoded sample.

    Each of ``DELIMITERS`` is tried with the CSV reader (so quoted fields holding a delimiter or a
    newline count right); the one that splits every complete row into the header's width, with
    the most columns (ties: the order of ``DELIMITERS``), wins (``source="detected"``). When no
    delimiter is consistent, ``csv.Sniffer`` restricted to ``DELIMITERS`` decides; else
    ``(",", "fallback")`` (e.g. a single-column file).
    """
    if not sample_text:
        return DEFAULT_DELIMITER, "fallback"
    widths = {d: _consistent_width(sample_text, d) for d in DELIMITERS}
    best = max(DELIMITERS, key=lambda d: (widths[d], -DELIMITERS.index(d)))
    if widths[best]:
        return best, "detected"
    try:
        found = csv.Sniffer().sniff(sample_text, delimiters="".join(DELIMITERS)).delimiter
    except csv.Error:
        found = None
    if found in DELIMITERS:
        return found, "detected"
    return DEFAULT_DELIMITER, "fallback"


def check_delimiter(delimiter: str) -> str:
    """Return ``delimiter`` if it is one of ``DELIMITERS``, else raise ``CsvError``."""
    if delimiter not in DELIMITERS:
        raise CsvError(f"delimiter must be one of {list(DELIMITERS)!r}, got {delimiter!r}")
    return delimiter


def normalise_missing(missing_values: Iterable[str]) -> tuple[str, ...]:
    """Declared missing-value markers, stripped, de-duplicated, in order. Raises ``CsvError``
    unless given a sequence of strings (a bare string is refused: ``("NA",)``, not ``"NA"``)."""
    if isinstance(missing_values, str | bytes) or not isinstance(missing_values, Iterable):
        raise CsvError("missing_values must be a sequence of strings, e.g. ('', 'NA')")
    out: list[str] = []
    for marker in missing_values:
        if not isinstance(marker, str):
            raise CsvError(f"missing-value marker {marker!r} is not a string")
        marker = marker.strip()
        if marker not in out:
            out.append(marker)
    return tuple(out)


def missing_markers(extra: Iterable[str] = (), *, defaults: bool = True) -> tuple[str, ...]:
    """The markers a steward declares: ``DEFAULT_MISSING_VALUES`` (unless ``defaults`` is false)
    plus ``extra``, normalised (``normalise_missing``). One rule for the upload form's "Empty cells
    are missing" + "Other markers" and ``dataset_ingest --missing`` / ``--no-default-missing``."""
    return normalise_missing([*(DEFAULT_MISSING_VALUES if defaults else ()), *extra])


# --- values and types ------------------------------------------------------------------------------


def classify_value(value: str, missing: Iterable[str] = DEFAULT_MISSING_VALUES) -> str | None:
    """Type of one cell (see module doc): ``None`` if missing, else one of ``TYPES``."""
    text = value.strip()
    if text in missing:
        return None
    if _INT.fullmatch(text):
        return "int" if _finite(text) else "str"
    if _FLOAT.fullmatch(text):
        return "float" if _finite(text) else "str"
    if text.lower() in _BOOLS:
        return "bool"
    if _DATE.fullmatch(text) and _is_date(text):
        return "date"
    return "str"


def widen(current: str | None, seen: str) -> str:
    """The common type of ``current`` (``None`` = nothing seen yet) and ``seen``."""
    if current is None or current == seen:
        return seen
    if current in _ORDER and seen in _ORDER:
        return "float"
    return "str"


def _finite(text: str) -> bool:
    return abs(float(text)) != float("inf")


def _is_date(text: str) -> bool:
    try:
        dt.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def strip_all(cells: Sequence[str]) -> Sequence[str]:
    """``cells`` with surrounding whitespace removed; the same object when none has any."""
    joined = "".join(cells)
    if joined.isascii() and not any(space in joined for space in _ASCII_SPACE):
        return cells
    return list(map(str.strip, cells))


def numeric_kind(values: Sequence[str]) -> str | None:
    """Fast batch test: ``None`` if some value cannot be a number in the sandbox's sense (a
    non-ASCII character, e.g. other scripts' digits, or ``_``, which ``float()`` would accept),
    else ``"float"`` if any value has ``.``, ``e`` or ``E``, else ``"int"``. The answer holds
    only if every value then parses with ``float()`` to a finite number (which also rules out
    ``nan``/``inf`` and anything else that is not a decimal number)."""
    joined = "".join(values)
    if not joined.isascii() or "_" in joined:
        return None
    if "." in joined or "e" in joined or "E" in joined:
        return "float"
    return "int"


def parses_as_float(text: str) -> bool:
    """Whether ``float(text)`` succeeds (any number, also ``nan``/``inf``)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def batch_kind(distinct: Iterable[str]) -> str | None:
    """Common kind of a set of non-missing stripped values (``None`` for an empty set)."""
    kind: str | None = None
    for value in distinct:
        kind = widen(kind, classify_value(value, ()) or "str")
        if kind == "str":
            break
    return kind


def numbers_of(values: Sequence[str]) -> tuple[str, np.ndarray] | None:
    """``(kind, float64 values)`` when every value (stripped, none missing) is a finite decimal
    number — ``numeric_kind``'s answer, confirmed by ``parse_floats`` — else ``None``: the one
    numeric rule of a batch, for ingest's profile and for the loader alike."""
    kind = numeric_kind(values)
    if kind is None:
        return None
    numbers = parse_floats(values)
    return None if numbers is None else (kind, numbers)


def infer_kind(
    distinct: Iterable[str], *, dates: Callable[[Iterable[str]], bool] | None = None
) -> str:
    """The type of a column from its distinct non-missing stripped values: ``bool`` if every
    value is ``true``/``false``, ``date`` if every value is an ISO date, else ``batch_kind``
    (``int``, ``float`` or ``str``); ``str`` for no value. The one inference rule of the
    sandbox, for ingest's profile (``profile.ColumnStats``, batch by batch, then ``widen``) and
    the loader's untyped parse (``loader.parse_table``, all values at once). ``dates`` replaces
    ``is_date_batch`` (a cache of validated dates gives the same answer)."""
    distinct = distinct if isinstance(distinct, set | frozenset) else set(distinct)
    if not distinct:
        return "str"
    if is_bool_batch(distinct):
        return "bool"
    if (dates or is_date_batch)(distinct):
        return "date"
    return batch_kind(distinct) or "str"


def is_bool_batch(distinct: Iterable[str]) -> bool:
    """Whether every value is ``true``/``false`` (any case)."""
    return all(value.lower() in _BOOLS for value in distinct)


def is_date_batch(distinct: Iterable[str]) -> bool:
    """Whether every value is an ISO 8601 calendar date ``YYYY-MM-DD``."""
    return all(_DATE.fullmatch(value) and _is_date(value) for value in distinct)


def first_misfit(values: Sequence[str], missing: frozenset[str], expected: str) -> int:
    """Index of the first value (stripped) that is neither missing nor of a kind ``expected``
    accepts; ``-1`` if there is none."""
    accepts = ACCEPTS[expected]
    for index, value in enumerate(values):
        if value not in missing and (classify_value(value, ()) or "str") not in accepts:
            return index
    return -1


def parse_floats(values: Sequence[str]) -> np.ndarray | None:
    """``float()`` of every value as a ``float64`` array, or ``None`` if one does not parse or is
    not finite (the numeric rule of ``classify_value`` for values already known to be numeric)."""
    try:
        numbers = np.fromiter(map(float, values), dtype=np.float64, count=len(values))
    except ValueError:
        return None
    return numbers if bool(np.isfinite(numbers).all()) else None


def column_values(kind: str, cells: Sequence[str], missing: frozenset[str]):
    """The values of ``cells`` (raw text) of a column of type ``kind``: the one rule by which a
    typed cell becomes a value (``sandbox.loader``). ``float64`` for ``int``/``float`` (missing →
    NaN), ``datetime64[D]`` for ``date`` (missing → NaT), a list of ``bool``/``None`` for
    ``bool`` (``true`` in any case is ``True``) and of ``str``/``None`` for ``str`` (stripped).
    Raises ``ValueError`` for a value that does not fit ``kind``."""
    if kind in NUMERIC_TYPES:
        if all(cells) and not any(parses_as_float(m) for m in missing):
            # No cell is empty and no marker is a number: a batch without missing cells parses
            # as it is (float() ignores surrounding whitespace); otherwise look up.
            try:
                return np.fromiter(map(float, cells), dtype=np.float64, count=len(cells))
            except ValueError:
                pass
        values = strip_all(cells)
        if not missing.isdisjoint(values):
            values = ["nan" if v in missing else v for v in values]
        return np.fromiter(map(float, values), dtype=np.float64, count=len(values))
    values = strip_all(cells)
    clean = missing.isdisjoint(values)
    if kind == "date":
        dates = values if clean else ["NaT" if v in missing else v for v in values]
        return np.array(dates, dtype="datetime64[D]")
    if kind == "bool":
        lowered = list(map(str.lower, values))
        if clean:
            return [v == "true" for v in lowered]
        return [None if v in missing else w == "true" for v, w in zip(values, lowered, strict=True)]
    return list(values) if clean else [None if v in missing else v for v in values]


def describe_type(kind: str) -> str:
    """Human description of a type for error messages (``"an integer"``)."""
    return _DESCRIBE[kind]


# --- records ----------------------------------------------------------------------------------------


def line_breaks(text: str) -> int:
    """Number of line breaks (``\\r\\n``, ``\\n`` or ``\\r``) in ``text``."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


class Batch:
    """Consecutive records of a CSV, every one as wide as the header (blank lines removed).

    ``columns`` holds one sequence of raw field strings per column and ``rows`` one list per
    record (whichever the reader did not produce is built on first use); ``n_rows`` counts the
    records; ``line_of(i)`` is the physical line (1-based) on which record ``i`` starts. A batch
    split natively (``RecordReader(native=True)``) holds ``pyarrow`` string arrays instead
    (``array(i)``; ``None`` for a column the reader was not asked for) and the block's text,
    and builds Python lists only when asked (``column(i)``, ``columns``, ``rows``).
    """

    def __init__(
        self,
        *,
        first_line: int,
        rows: list[list[str]] | None = None,
        columns: list[list[str]] | None = None,
        raw: list[list[str]] | None = None,
        kept: list[int] | None = None,
        arrays: list | None = None,
        text: str | None = None,
        data: bytes | None = None,
        delimiter: str = DEFAULT_DELIMITER,
    ) -> None:
        self.first_line = first_line
        self._rows = rows
        self._columns = columns
        self._raw = raw  # records as read, blank lines included (None: one record per line)
        self._kept = kept  # index into _raw of each record (None: the same index)
        self._arrays = arrays  # native: one pyarrow string array (or None) per column
        self._text = text  # native: the block's text (whole lines, no quote), for line_of
        self._data = data  # native: the text as UTF-8
        self._delimiter = delimiter
        self._starts: list[int] | None = None

    @property
    def native(self) -> bool:
        """Whether the cells are held as ``pyarrow`` arrays (``array(i)``)."""
        return self._arrays is not None

    @property
    def text(self) -> str | None:
        """The block's text (native batches only; whole lines, no quote)."""
        return self._text

    @property
    def data(self) -> bytes | None:
        """The block's text as UTF-8 (native batches only)."""
        return self._data

    def array(self, index: int):
        """Column ``index`` as a ``pyarrow`` array (``sandbox.arrowcsv`` shapes), or ``None``
        (not a native batch, or a column the reader was not asked for)."""
        return self._arrays[index] if self._arrays is not None else None

    def column(self, index: int) -> Sequence[str]:
        """Column ``index`` as a sequence of raw field strings."""
        return self.columns[index]

    @property
    def rows(self) -> list[list[str]]:
        if self._rows is None:
            self._rows = [list(row) for row in zip(*self.columns, strict=True)]
        return self._rows

    @property
    def columns(self) -> list[Sequence[str]]:
        if self._columns is None:
            if self._rows is None:  # native: split the block's lines (no quote, none ragged)
                lines = io.StringIO(self._text, newline="").readlines()
                blank = ("\n", "\r\n", "\r")
                self._rows = [
                    line.rstrip("\r\n").split(self._delimiter)
                    for line in lines
                    if line not in blank
                ]
            self._columns = list(zip(*self._rows, strict=True))
        return self._columns

    @property
    def n_rows(self) -> int:
        if self._arrays is not None:
            return next(len(a) for a in self._arrays if a is not None)
        return len(self._rows) if self._rows is not None else len(self._columns[0])

    def line_of(self, index: int) -> int:
        """Physical line number on which record ``index`` starts."""
        if self._text is not None:
            if self._starts is None:
                lines = io.StringIO(self._text, newline="").readlines()
                blank = ("\n", "\r\n", "\r")
                self._starts = [i for i, line in enumerate(lines) if line not in blank]
            return self.first_line + self._starts[index]
        if self._raw is None:
            return self.first_line + index
        raw_index = self._kept[index] if self._kept is not None else index
        return self.first_line + sum(
            1 + sum(line_breaks(cell) for cell in row) for row in self._raw[:raw_index]
        )


#: Input limits (the portal passes its settings; ``None`` is no limit): columns in the header, and
#: characters in one physical line, checked while streaming so memory stays bounded.
DEFAULT_MAX_COLUMNS = 1000
DEFAULT_MAX_LINE_CHARS = 1_000_000


class _LineLimited:
    """A text stream whose physical lines may not exceed ``limit`` characters.

    Wraps ``read``/``readline`` (what ``RecordReader`` calls): every chunk read is measured
    (``str.splitlines``, carrying the open line's length across chunks) and ``readline`` asks
    for at most ``limit + 1`` characters, so no line is ever held whole beyond the limit. Raises
    ``CsvError`` naming the line and the limit.
    """

    def __init__(self, text: TextIO, limit: int, name: str) -> None:
        self._text, self._limit, self._name = text, limit, name
        self._run = 0  # characters of the line still open at the end of the last read
        self._breaks = 0  # line breaks read so far

    def _measure(self, chunk: str) -> str:
        if not chunk:
            return chunk
        parts = chunk.splitlines()
        ends_open = chunk[-1] not in "\r\n"
        lengths = [len(p) for p in parts] or [0]
        lengths[0] += self._run
        for index, length in enumerate(lengths):
            if length > self._limit:
                raise CsvError(
                    f"line {self._breaks + index + 1}: longer than the limit of "
                    f"{self._limit:,} characters per line ({self._name})"
                )
        closed = len(parts) - (1 if ends_open else 0)
        self._breaks += closed
        self._run = lengths[-1] if ends_open else 0
        return chunk

    def read(self, size: int = -1) -> str:
        return self._measure(self._text.read(size))

    def readline(self, size: int = -1) -> str:
        cap = self._limit + 1 - self._run
        size = cap if size is None or size < 0 else min(size, cap)
        return self._measure(self._text.readline(max(size, 1)))


class RecordReader:
    """Streaming CSV reader over a text stream opened with ``newline=""``.

    ``header`` is the validated header (names); ``batches()`` yields one ``Batch`` per block of
    about ``block_chars`` characters of whole lines. ``tee``, if given, receives the decoded text
    exactly as read (whole lines, in order), which lets a comma-delimited source be copied
    through unchanged. Memory is one block. Errors are ``CsvError`` with the physical line; a
    decoding error propagates as ``UnicodeDecodeError`` for the caller to locate (see
    ``locate_decode_error``).

    A block without any ``"`` is split with ``str.split`` (every line is then exactly one
    record: without quotes a line break always ends a record and the ``csv`` module returns
    the same fields); a block with a quote goes through ``csv.reader`` (strict), which reads
    further lines when a quoted field runs past the end of the block.

    ``max_columns`` and ``max_line_chars`` (``None``: no limit) refuse, while streaming, a header
    of more columns and a physical line of more characters (``CsvError`` naming the limit).

    ``native`` (needs ``pyarrow``, see ``sandbox.arrowcsv``) is a function giving, before each
    block, the shape wanted for every column (``"int"``, ``"float"``, ``"dict"`` or ``None``);
    a block without any ``"`` then goes to Arrow's CSV parser first, with ``markers`` (the
    stripped missing-value markers) as the nulls of numeric columns, and the batch holds
    ``pyarrow`` arrays. Arrow is used only where it reads exactly as the rules above; a block it
    does not accept (a ragged or whitespace-only line, a cell its numeric column cannot hold)
    takes the Python path, which gives the same records or the same error.
    """

    def __init__(
        self,
        text: TextIO,
        *,
        delimiter: str = DEFAULT_DELIMITER,
        tee: Callable[[str], object] | None = None,
        block_chars: int = BLOCK_CHARS,
        native: Callable[[], list[str | None]] | None = None,
        markers: tuple[str, ...] = DEFAULT_MISSING_VALUES,
        max_columns: int | None = None,
        max_line_chars: int | None = None,
    ) -> None:
        if max_line_chars is not None:
            text = _LineLimited(text, max_line_chars, "FRP_MAX_LINE_CHARS")
        self._max_spill = max_line_chars
        self._max_columns = max_columns
        self._text = text
        self._tee = tee
        self._block = block_chars
        self._native = native if arrowcsv.AVAILABLE else None
        self._markers = markers
        self._delimiter = check_delimiter(delimiter)
        self._line = 0  # physical lines consumed so far
        self._carry: tuple[list[list[str]], int] | None = None
        self.header = self._read_header()
        self.width = len(self.header)

    def _spill(self, first: int) -> Iterator[str]:
        """The lines after a block that a quoted field runs on into (``first``: the physical
        line of the first). With ``max_line_chars``, at most that many characters: a record of
        many short lines would otherwise be read whole, however long (a hostile re-test of
        issue 9 held a 16.6 MB cell of short lines: 150 MB per upload); ``CsvError`` then."""
        spilled = 0
        while line := self._text.readline():
            spilled += len(line)
            if self._max_spill is not None and spilled > self._max_spill:
                raise CsvError(
                    f"line {first}: a quoted field runs on over more than {self._max_spill:,} "
                    "characters past its block of lines (FRP_MAX_LINE_CHARS)"
                )
            first += 1
            if self._tee is not None:
                self._tee(line)
            yield line

    def _read_text(self, size: int) -> str:
        """About ``size`` characters of whole lines (``\\n``, ``\\r\\n`` or ``\\r`` ends; a
        ``\\r\\n`` is never cut in two); ``""`` at the end of the stream."""
        text = self._text.read(max(size, 1))
        if not text:
            return text
        while text.endswith("\r"):
            more = self._text.read(1)
            text += more
            if more in ("", "\n"):
                return text
        if not text.endswith("\n"):
            text += self._text.readline()
        return text

    def _next_block(
        self, width: int = 0, size: int | None = None
    ) -> tuple[list[list[str]], int] | Batch | None:
        """The next block: its raw records (blank lines as ``[]``) and the line of the first,
        or — when ``width`` > 1 is given and every line of an unquoted block holds exactly
        ``width`` fields — a ready ``Batch`` of columns, cut from one ``str.split`` of the block
        (no per-record lists, no transposition), or a native ``Batch`` (class doc)."""
        joined = self._read_text(self._block if size is None else size)
        if not joined:
            return None
        if self._tee is not None:
            self._tee(joined)
        first = self._line + 1
        if self._native is not None and width and '"' not in joined:
            split = arrowcsv.split_block(
                joined,
                width=width,
                delimiter=self._delimiter,
                shapes=self._native(),
                markers=self._markers,
            )
            if split is not None:
                arrays, lines, data = split
                self._line += lines
                return Batch(
                    first_line=first,
                    arrays=arrays,
                    text=joined,
                    data=data,
                    delimiter=self._delimiter,
                )
        lines = io.StringIO(joined, newline="").readlines()
        if '"' not in joined and width > 1:
            delimiter = self._delimiter
            counts = set(map(str.count, lines, itertools.repeat(delimiter)))
            if counts == {width - 1}:
                if "\r" in joined:
                    joined = joined.replace("\r\n", "\n").replace("\r", "\n")
                if joined.endswith("\n"):
                    joined = joined[:-1]
                cells = joined.replace("\n", delimiter).split(delimiter)
                self._line += len(lines)
                columns = [cells[i::width] for i in range(width)]
                return Batch(first_line=first, columns=columns)
        if '"' not in joined:
            stripped = map(str.rstrip, lines, itertools.repeat("\r\n"))
            rows = list(map(str.split, stripped, itertools.repeat(self._delimiter)))
            if [""] in rows:
                rows = [row if row != [""] else [] for row in rows]
            self._line += len(lines)
            return rows, first
        reader = csv.reader(
            itertools.chain(lines, self._spill(first + len(lines))),
            delimiter=self._delimiter,
            quotechar='"',
            doublequote=True,
            strict=True,
        )
        rows: list[list[str]] = []
        try:
            while reader.line_num < len(lines):
                before = reader.line_num
                rows.extend(itertools.islice(reader, max(1, (len(lines) - before) // 2)))
                if reader.line_num == before:
                    break
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):
                # The record that never ended starts after the records read so far.
                start = first + sum(1 + sum(line_breaks(cell) for cell in row) for row in rows)
                raise CsvError(
                    f"line {start}: a quoted field is not closed (the file ends inside it)"
                ) from None
            raise CsvError(f"line {first - 1 + reader.line_num}: {exc}") from None
        self._line += reader.line_num
        return rows, first

    def _read_header(self) -> list[str]:
        while True:
            block = self._next_block(size=1)  # the header line (and any blank lines before it)
            if block is None:
                raise CsvError("empty file: a header row is required")
            rows, line = block
            for index, row in enumerate(rows):
                if not row:
                    line += 1
                    continue
                if not any(cell.strip() for cell in row):
                    raise CsvError(f"line {line}: the header row is empty")
                after = line + 1 + sum(line_breaks(cell) for cell in row)
                self._carry = (rows[index + 1 :], after)
                if self._max_columns is not None and len(row) > self._max_columns:
                    raise CsvError(
                        f"line {line}: {len(row):,} columns, more than the limit of "
                        f"{self._max_columns:,} columns (FRP_MAX_COLUMNS)"
                    )
                return self._check_header(row, line)

    @staticmethod
    def _check_header(header: list[str], line: int) -> list[str]:
        names = [name.strip() for name in header]
        names[0] = names[0].removeprefix("\ufeff").strip()
        first_seen: dict[str, int] = {}
        for index, name in enumerate(names, start=1):
            if not name:
                raise CsvError(f"line {line}, column {index}: empty column name")
            if name in first_seen:
                raise CsvError(
                    f"line {line}: duplicate column name {name!r} "
                    f"(columns {first_seen[name]} and {index})"
                )
            first_seen[name] = index
        return names

    def batches(self) -> Iterator[Batch]:
        """Yield batches until the end of the stream. Raises ``CsvError`` on a ragged row or a
        syntax error (unclosed quote, stray quote)."""
        width = self.width
        block, self._carry = self._carry, None
        while True:
            if block is None:
                block = self._next_block(width)
                if block is None:
                    return
            if isinstance(block, Batch):
                yield block
                block = None
                continue
            raw, first_line = block
            block = None
            if not raw:
                continue
            widths = set(map(len, raw))
            if widths == {width} and width > 1:
                yield Batch(first_line=first_line, rows=raw, raw=raw)
                continue
            kept = [
                i
                for i, row in enumerate(raw)
                if row and not (width > 1 and len(row) == 1 and not row[0].strip())
            ]
            batch = Batch(first_line=first_line, rows=[raw[i] for i in kept], raw=raw, kept=kept)
            for index, row in enumerate(batch.rows):
                if len(row) != width:
                    raise CsvError(
                        f"line {batch.line_of(index)}: expected {width} fields, found {len(row)}"
                    )
            if batch.rows:
                yield batch


def locate_decode_error(raw_bytes: Iterable[bytes], encoding: str, delimiter: str) -> str:
    """Where a decoding error is, for a message: ``"line N, column 'name'"`` or ``"line N"``.

    Re-reads the file's bytes (an iterable of blocks from the start) with an incremental decoder
    to find the first undecodable byte, counts the line breaks before it and, from the text of
    that line, which field it falls in (the header names it, when the line is a data row).
    """
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    breaks = 0
    line_text = ""
    header: list[str] | None = None
    for block in raw_bytes:
        try:
            text = decoder.decode(block)
        except UnicodeDecodeError as exc:
            text = decoder.decode(block[: exc.start]) if exc.start else ""
            decoder.reset()
            line_text, breaks, header = _advance(line_text, text, breaks, header, delimiter)
            return _where(breaks, line_text, header, delimiter)
        line_text, breaks, header = _advance(line_text, text, breaks, header, delimiter)
    return f"line {breaks + 1}"


def _advance(
    line_text: str, text: str, breaks: int, header: list[str] | None, delimiter: str
) -> tuple[str, int, list[str] | None]:
    combined = line_text + text
    parts = re.split(r"\r\n|\r|\n", combined)
    if header is None and len(parts) > 1:
        header = _split_fields(parts[0].removeprefix("\ufeff"), delimiter)
    return parts[-1], breaks + len(parts) - 1, header


def _split_fields(text: str, delimiter: str) -> list[str]:
    try:
        reader = csv.reader([text], delimiter=delimiter)
        return next(reader, [])
    except csv.Error:
        return []


def _where(breaks: int, line_text: str, header: list[str] | None, delimiter: str) -> str:
    line = breaks + 1
    if line == 1 or not header:
        return f"line {line}"
    fields = _split_fields(line_text, delimiter)
    index = max(len(fields) - 1, 0)
    if index < len(header):
        return f"line {line}, column {header[index].strip()!r}"
    return f"line {line}"


# --- the canonical payload -------------------------------------------------------------------------

#: The ``format`` of the trailer's meta JSON (``sandbox.ingest`` writes it, ``sandbox.loader`` checks it).
PAYLOAD_FORMAT = "frp-csv/1"
TRAILER_MAGIC = b"\n#FRP-CANONICAL-CSV/1\n"
_TRAILER_LEN_BYTES = 4


def encode_trailer(meta: bytes) -> bytes:
    """Trailer appended after the canonical CSV: ``meta || u32 len(meta) || TRAILER_MAGIC``."""
    return meta + len(meta).to_bytes(_TRAILER_LEN_BYTES, "big") + TRAILER_MAGIC


def split_trailer(payload: bytes | memoryview) -> tuple[int, bytes] | None:
    """``(csv_length, meta)`` if ``payload`` ends with a trailer, else ``None`` (an object stored
    before the canonical format: the original CSV bytes)."""
    view = memoryview(payload)
    tail = len(TRAILER_MAGIC) + _TRAILER_LEN_BYTES
    if len(view) < tail or bytes(view[-len(TRAILER_MAGIC) :]) != TRAILER_MAGIC:
        return None
    size = int.from_bytes(view[-tail : -len(TRAILER_MAGIC)], "big")
    if size > len(view) - tail:
        return None
    start = len(view) - tail - size
    return start, bytes(view[start : len(view) - tail])

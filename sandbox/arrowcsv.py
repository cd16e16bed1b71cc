"""Native (Apache Arrow) helpers for the sandbox's CSV fast path (site-side, imports no Django).

Owns every call into ``pyarrow`` so that ``sandbox.csvformat``, ``sandbox.profile``,
``sandbox.ingest`` and ``sandbox.loader`` keep one set of CSV rules (``sandbox.csvformat``'s
module doc) whichever engine reads a block. The contract is conservative: each helper either
gives exactly what the pure-Python rules would give, or ``None`` ("cannot tell"), and the caller
then runs the Python rules on the same cells — which also produces the exact error message. So
Arrow never decides what is valid; it only makes the common case (a block of whole lines
without any ``"``, every line as wide as the header) cheap.

What is native:

* ``split_block``: a block of whole lines without quotes, split into string columns by Arrow's
  CSV parser (quoting off, blank lines skipped, every cell a string, never null). A line of the
  wrong width, a whitespace-only line in a multi-column file or an empty block gives ``None``.
* ``strip``: ``str.strip()`` on every cell (Arrow ``utf8_trim`` with exactly the code points
  ``str.isspace`` accepts), skipped when the cells hold no byte that could be whitespace.
* ``finite_floats``: ``float()`` of every cell when all are finite decimal numbers (Arrow's
  string→float64 cast is correctly rounded, like ``float()``, and accepts a subset of what
  ``float()`` accepts: no ``_`` separators, no whitespace, no non-ASCII digits); ``None``
  otherwise.
* ``counts``: distinct values with their counts (Arrow ``value_counts``).

``AVAILABLE`` is ``False`` when ``pyarrow`` is not installed; callers then use the Python path.
"""

from __future__ import annotations

import importlib.util

import numpy as np

# Imported on first use (about 0.3 s), so a small dataset's loader never pays for it.
pa = pc = pcsv = None
# Arrow's default pool (mimalloc) keeps about 10 MiB more resident than the C library's
# allocator here; every call below takes the system pool, for a low peak RSS.
_POOL = None
AVAILABLE = importlib.util.find_spec("pyarrow") is not None

# Every code point str.strip() removes, i.e. those str.isspace() accepts (Python 3.11's Unicode
# tables; tests/sandbox/test_arrowcsv.py recomputes it).
PY_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# Bytes of UTF-8 text that can belong to such a code point: ASCII whitespace and any non-ASCII.
_MAYBE_SPACE = np.zeros(256, dtype=bool)
_MAYBE_SPACE[[ord(c) for c in PY_WHITESPACE if ord(c) < 128]] = True
_MAYBE_SPACE[128:] = True


def load() -> bool:
    """Import ``pyarrow`` (once); ``False`` when it is not installed."""
    global pa, pc, pcsv, _POOL
    if pa is None and AVAILABLE:
        import pyarrow
        import pyarrow.compute
        import pyarrow.csv

        pa, pc, pcsv = pyarrow, pyarrow.compute, pyarrow.csv
        _POOL = pyarrow.system_memory_pool()
    return pa is not None


def _value_bytes(array) -> np.ndarray:
    """The UTF-8 bytes of all cells of a string ``array``, concatenated (a view, no copy)."""
    if len(array) == 0:
        return np.empty(0, dtype=np.uint8)
    _validity, offsets, data = array.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32)
    start, end = int(bounds[array.offset]), int(bounds[array.offset + len(array)])
    if data is None:
        return np.empty(0, dtype=np.uint8)
    return np.frombuffer(data, dtype=np.uint8)[start:end]


def split_block(text: str, *, width: int, delimiter: str, columns: list[int] | None = None):
    """Split ``text`` (whole lines, no ``"``) into ``width`` columns of cells, or ``None``.

    Returns a list of ``width`` ``pyarrow.StringArray`` (``None`` for columns not in
    ``columns``, when given), one cell per non-blank line, followed by the number of physical
    lines in ``text`` (blank ones included), or ``None`` when the block is not one
    Arrow reads exactly as the Python rules do: a line with another number of fields, a
    whitespace-only line in a multi-column file, a block with no record.
    """
    if '"' in text or not load():
        return None
    names = [f"c{i}" for i in range(width)]
    data = text.encode("utf-8")
    wanted = names if columns is None else [names[i] for i in columns]
    try:
        table = pcsv.read_csv(
            pa.py_buffer(data),
            read_options=pcsv.ReadOptions(
                column_names=names, use_threads=False, block_size=len(data) + 1
            ),
            parse_options=pcsv.ParseOptions(
                delimiter=delimiter,
                quote_char=False,
                double_quote=False,
                escape_char=False,
                newlines_in_values=False,
                ignore_empty_lines=True,
            ),
            convert_options=pcsv.ConvertOptions(
                # binary: Arrow skips its UTF-8 check (the text came from a Python str, so it is
                # valid UTF-8) and the arrays are viewed as strings below, without a copy.
                column_types=dict.fromkeys(wanted, pa.binary()),
                include_columns=wanted,
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                null_values=[],
                check_utf8=False,
            ),
            memory_pool=_POOL,
        )
    except (pa.ArrowInvalid, pa.ArrowException):
        return None
    if table.num_rows == 0:
        return None
    out: list = [None] * (width + 1)
    if b"\r" in data:
        lines = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
    else:
        lines = int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == 10))
    out[width] = lines + (0 if data.endswith((b"\n", b"\r")) else 1)
    for name in wanted:
        column = table.column(name)
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        out[int(name[1:])] = array.view(pa.string())
    return out


def strip(array):
    """``array`` with ``str.strip()`` applied to every cell (the same object when no cell
    starts or ends with a byte that could belong to a whitespace character)."""
    if len(array) == 0:
        return array
    _validity, offsets, data = array.buffers()
    if data is None:
        return array
    bounds = np.frombuffer(offsets, dtype=np.int32)[array.offset : array.offset + len(array) + 1]
    starts, ends = bounds[:-1], bounds[1:]
    filled = ends > starts
    if not filled.all():
        starts, ends = starts[filled], ends[filled]
    raw = np.frombuffer(data, dtype=np.uint8)
    if not (_MAYBE_SPACE[raw[starts]].any() or _MAYBE_SPACE[raw[ends - 1]].any()):
        return array
    return pc.utf8_trim(array, characters=PY_WHITESPACE, memory_pool=_POOL)


def missing_mask(array, markers):
    """``(mask, n)``: which cells equal one of ``markers`` (a ``pyarrow`` string array of the
    stripped markers) and how many; ``(None, 0)`` when there are no markers or no match."""
    if markers is None or len(markers) == 0:
        return None, 0
    mask = pc.is_in(array, value_set=markers, memory_pool=_POOL)
    n = int(pc.sum(mask, memory_pool=_POOL).as_py() or 0)
    return (mask, n) if n else (None, 0)


def marker_array(markers) -> object:
    """The markers as a ``pyarrow`` string array (for ``missing_mask``)."""
    return pa.array(list(markers), type=pa.string(), memory_pool=_POOL) if load() else None


def drop(array, mask):
    """``array`` without the cells where ``mask`` is true."""
    return (
        array
        if mask is None
        else pc.filter(array, pc.invert(mask, memory_pool=_POOL), memory_pool=_POOL)
    )


_NUMBER_CHARS = b"0123456789+-"
_FLOAT_CHARS = b".eE"


def number_bytes(array) -> bytes | None:
    """The bytes of ``array``'s cells other than digits and signs, when every byte is a digit,
    a sign, ``.``, ``e`` or ``E`` (so no cell has whitespace, a letter or a non-ASCII
    character); else ``None``."""
    raw = array.buffers()[2]
    if raw is None:
        return b""
    rest = _value_bytes(array).tobytes().translate(None, _NUMBER_CHARS)
    return None if rest.translate(None, _FLOAT_CHARS) else rest


def has_empty(array) -> bool:
    """Whether some cell of the string ``array`` is ``""``."""
    _validity, offsets, _data = array.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int32)[array.offset : array.offset + len(array) + 1]
    return bool((bounds[1:] == bounds[:-1]).any())


def finite_floats(array, rest: bytes | None = None) -> tuple[str, np.ndarray] | None:
    """``(kind, values)`` when every cell (stripped, none missing) is a finite decimal number:
    ``kind`` is ``"float"`` if any cell has ``.``, ``e`` or ``E``, else ``"int"`` (the rule of
    ``csvformat.numeric_kind``), ``values`` a ``(n,)`` float64 array equal to ``float()`` of
    each cell. ``None`` when that cannot be shown (the Python rules then decide). ``rest`` is
    ``number_bytes(array)`` if already known."""
    if rest is None:
        rest = number_bytes(array)
    if rest is None or has_empty(array):
        return None
    try:
        numbers = pc.cast(array, pa.float64(), memory_pool=_POOL).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowException):
        return None
    if not np.isfinite(numbers).all():
        return None
    return ("float" if rest else "int"), numbers


def counts(array) -> tuple[list[str], list[int]]:
    """Distinct cells of ``array`` and how often each occurs (first-seen order)."""
    table = pc.value_counts(array, memory_pool=_POOL)
    return table.field("values").to_pylist(), table.field("counts").to_pylist()


def to_strings(array) -> list[str]:
    """The cells as a list of Python ``str`` (the fallback to the Python rules)."""
    return array.to_pylist()


def dictionary(array) -> tuple[list[str], np.ndarray]:
    """``(distinct values, (n,) int index of each cell into them)`` (Arrow
    ``dictionary_encode``), so a column of few distinct strings costs one pointer per row."""
    encoded = pc.dictionary_encode(array, memory_pool=_POOL)
    if isinstance(encoded, pa.ChunkedArray):  # pragma: no cover - arrays stay arrays
        encoded = encoded.combine_chunks()
    return encoded.dictionary.to_pylist(), encoded.indices.to_numpy(zero_copy_only=False)


def mask_to_numpy(mask) -> np.ndarray:
    """A boolean ``pyarrow`` array as a numpy bool array."""
    return mask.to_numpy(zero_copy_only=False)


def numbers_or_nan(array, markers) -> np.ndarray | None:
    """``float()`` of every cell (stripped) as a ``(n,)`` float64 array, ``nan`` where the cell
    is a missing-value marker (the loader's rule); ``None`` when a present cell is not one
    Arrow reads exactly as ``float()`` (the Python rules then decide, or raise)."""
    rest = number_bytes(array)
    numeric_marker = any(m and not m.strip("0123456789+-.eE") for m in markers.to_pylist())
    if rest is not None and not numeric_marker and not has_empty(array):
        values, mask = array, None
    else:
        values = strip(array)
        mask, _n = missing_mask(values, markers)
        if mask is not None:
            values = pc.if_else(mask, pa.scalar("nan", pa.string()), values, memory_pool=_POOL)
    try:
        return pc.cast(values, pa.float64(), memory_pool=_POOL).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowException):
        return None


def strings_or_none(array, markers) -> np.ndarray:
    """The cells (stripped) as an object array of ``str``, ``None`` where the cell is a
    missing-value marker; equal strings share one object (dictionary encoding)."""
    values = strip(array)
    mask, _n = missing_mask(values, markers)
    distinct, index = dictionary(values)
    lookup = np.empty(len(distinct) + 1, dtype=object)
    lookup[: len(distinct)] = distinct
    lookup[len(distinct)] = None
    if mask is not None:
        index = np.where(mask_to_numpy(mask), len(distinct), index)
    return lookup[index]

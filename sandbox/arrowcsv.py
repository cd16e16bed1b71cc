"""Native (Apache Arrow) helpers for the sandbox's CSV fast path (site-side, imports no Django).

Owns every call into ``pyarrow`` so that ``sandbox.csvformat``, ``sandbox.profile``,
``sandbox.ingest`` and ``sandbox.loader`` keep one set of CSV rules (``sandbox.csvformat``'s
module doc) whichever engine reads a block. The contract is conservative: Arrow either gives
exactly what the pure-Python rules would give, or nothing ("cannot tell"), and the caller then
runs the Python rules on the same cells — which also produces the exact error message. So Arrow
never decides what is valid; it only makes the common case (a block of whole lines without any
``"``, every line as wide as the header) cheap.

``split_block`` hands such a block to Arrow's CSV parser (quoting off, blank lines skipped) and
asks for each column one of three shapes, chosen by the caller from what it knows of the column:

* ``"int"`` — Arrow ``int64``: every cell an ASCII decimal integer without ``+`` (Arrow refuses
  a ``+``, a fraction, an exponent, an overflow), or a missing-value marker written exactly
  (null). Arrow trims spaces and tabs around a number, as ``str.strip`` would; a ``-0`` loses
  its sign, which changes a sum only when every value is zero: a caller must not use a column
  of zeros when the block holds ``-0`` (``NEG_ZERO``).
* ``"float"`` — Arrow ``float64``: the same for decimal numbers; Arrow's parser (fast_float) is
  correctly rounded like ``float()`` and accepts a subset of what ``float()`` accepts (no
  ``_``, no non-ASCII digits), but it does read ``nan``/``inf``, which the caller must check.
* ``"dict"`` — dictionary-encoded strings: the distinct raw cells and one index per row, so
  the caller applies the Python rules to each distinct value once.

A null in a numeric column is a cell equal to a marker as written; since Arrow trims a number
but not a marker, a caller must not ask for a numeric column when a marker is itself a number
(``" -999"`` would parse as a number where the Python rules strip it to the marker ``-999``).
Any cell Arrow cannot convert makes ``split_block`` return ``None`` for the whole block.

Only ``pyarrow`` and ``pyarrow.csv`` are imported (``pyarrow.compute`` would add about 15 MiB
of resident memory), on first use; ``AVAILABLE`` is ``False`` when ``pyarrow`` is not installed,
and callers then use the Python path.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np

# Imported on first use (about 0.3 s), so a small dataset's loader never pays for it.
pa = pcsv = None
AVAILABLE = importlib.util.find_spec("pyarrow") is not None
# Arrow's default pool (mimalloc) keeps about 10 MiB more resident than the C library's
# allocator here; every call below takes the system pool, for a low peak RSS.
_POOL = None
_SHAPES: dict = {}

# A cell that is minus zero, possibly padded (any delimiter; a superset is harmless). It starts
# with the literal "-" so the regex engine skips ahead quickly.
NEG_ZERO = re.compile(r"-(?<![^,;\t\r\n ]-)0+[ \t]*(?=[,;\t\r\n]|$)")


def load() -> bool:
    """Import ``pyarrow`` (once); ``False`` when it is not installed."""
    global pa, pcsv, _POOL
    if pa is None and AVAILABLE:
        import pyarrow
        import pyarrow.csv

        pa, pcsv = pyarrow, pyarrow.csv
        _POOL = pyarrow.system_memory_pool()
        _SHAPES.update(
            int=pyarrow.int64(),
            float=pyarrow.float64(),
            dict=pyarrow.dictionary(pyarrow.int32(), pyarrow.string()),
        )
    return pa is not None


def split_block(
    text: str,
    *,
    width: int,
    delimiter: str,
    shapes: list[str | None],
    markers: tuple[str, ...],
):
    """Split ``text`` (whole lines, no ``"``) into ``width`` columns, or ``None``.

    ``shapes[i]`` is ``"int"``, ``"float"``, ``"dict"`` (module doc) or ``None`` (column not
    wanted); ``markers`` are the stripped missing-value markers (nulls of numeric columns).
    Returns ``(arrays, lines, data)``: ``width`` ``pyarrow`` arrays (``None`` where not
    wanted), one cell per non-blank line; the number of physical lines in ``text`` (blank
    ones included); ``text`` encoded as UTF-8. ``None`` when Arrow does not read the block exactly as the Python rules do (a line of
    another width, a whitespace-only line in a multi-column file, a cell a numeric column
    cannot hold) or the block has no record.
    """
    if '"' in text or not load():
        return None
    names = [f"c{i}" for i in range(width)]
    wanted = {names[i]: _SHAPES[shape] for i, shape in enumerate(shapes) if shape is not None}
    data = text.encode("utf-8")
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
                column_types=wanted,
                include_columns=list(wanted),
                null_values=list(markers),
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                check_utf8=False,  # the text came from a Python str: valid UTF-8
            ),
            memory_pool=_POOL,
        )
    except (pa.ArrowInvalid, pa.ArrowException):
        return None
    if table.num_rows == 0:
        return None
    arrays: list = [None] * width
    for name in wanted:
        column = table.column(name)
        arrays[int(name[1:])] = (
            column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        )
    if b"\r" in data:
        lines = data.count(b"\n") + data.count(b"\r") - data.count(b"\r\n")
    else:
        lines = int(np.count_nonzero(np.frombuffer(data, dtype=np.uint8) == 10))
    return arrays, lines + (0 if data.endswith((b"\n", b"\r")) else 1), data


def shape_of(array) -> str:
    """``"int"``, ``"float"`` or ``"dict"``: which shape ``split_block`` gave ``array``."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return "dict"
    return "int" if pa.types.is_integer(kind) else "float"


def valid(array) -> np.ndarray | None:
    """``(n,)`` bool, true where ``array`` holds a value (not null); ``None`` if no null."""
    if array.null_count == 0:
        return None
    bits = np.frombuffer(array.buffers()[0], dtype=np.uint8)
    mask = np.unpackbits(bits, bitorder="little")[array.offset : array.offset + len(array)]
    return mask.astype(bool)


def numbers(array) -> np.ndarray:
    """The values of a numeric ``array`` as ``(n,)`` float64, ``nan`` where null."""
    values = array.to_numpy(zero_copy_only=False)
    return values if values.dtype == np.float64 else values.astype(np.float64)


def dictionary(array) -> tuple[list[str], np.ndarray]:
    """``(distinct raw cells, (n,) int index of each cell into them)`` of a ``"dict"`` array."""
    return array.dictionary.to_pylist(), array.indices.to_numpy(zero_copy_only=False)

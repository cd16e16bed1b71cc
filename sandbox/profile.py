"""Column statistics and the disclosure-controlled profile of a dataset version (site-side, no Django).

``ColumnStats`` keeps a running, constant-memory summary of one column while ingest streams the
file; ``compute_profile`` turns the summaries into what researchers may see: per column its type,
missing count, mean and standard deviation to 3 significant figures, and category counts — counts
of 1–7 shown as ``"≤7"``, the rest rounded to the nearest 5, the output-checking rule of trusted
research environments (OpenSAFELY's ``redact_small_numbers(n=7, rounding_base=5)``; the UK SDAP
statistical disclosure control handbook). No minimum or maximum: each is one record's value.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sandbox import arrowcsv
from sandbox.csvformat import (
    ACCEPTS,
    DEFAULT_MISSING_VALUES,
    NUMERIC_TYPES,
    CellError,
    classify_value,
    first_misfit,
    infer_kind,
    is_date_batch,
    numbers_of,
    parse_floats,
    parses_as_float,
    strip_all,
    widen,
)

SMALL_COUNT = 7
ROUNDING_BASE = 5
SUPPRESSED = "≤7"
#: What a suppressed count stands for where released counts are added up or divided (data-volume
#: shares, totals): the middle of 1–7, one figure for every suppressed count, so what is computed
#: from released counts tells nothing the released counts do not (``released_count``).
SUPPRESSED_STANDS_FOR = 4
MAX_CATEGORIES = 20
MAX_TRACKED_DISTINCT = 10_000
MAX_CATEGORY_LENGTH = 100
MAX_TEXT_VALUES = 20
PROFILE_FORMAT = 2


@dataclass
class ColumnStats:
    """Running summary of one column (constant memory apart from bounded category counts).

    ``declared`` is the steward's type override (``None``: infer). ``count``/``missing`` count
    values and missing cells; ``numeric_count``, ``mean``, ``m2``, ``min``, ``max`` summarise the
    values while the column is ``int``/``float``; ``first_date``/``last_date`` (ISO strings)
    while it is ``date``; ``categories`` counts distinct values until there are more than
    ``MAX_TRACKED_DISTINCT`` or one is longer than ``MAX_CATEGORY_LENGTH`` (then ``None``).

    For the steward's warnings and the job form's identifier check: ``number_cells`` counts the
    values that are numbers (whatever the column's type), ``text_cells`` the values that are not,
    by value, while there are at most ``MAX_TEXT_VALUES`` distinct ones (then ``None``): a column
    read as text because of a few undeclared markers (``NA``, ``?``) shows here. ``monotone``:
    the numbers met so far are strictly increasing or strictly decreasing in file order.
    """

    name: str
    type: str | None = None
    missing: int = 0
    count: int = 0
    numeric_count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    categories: Counter | None = field(default_factory=Counter)
    declared: str | None = None
    first_date: str | None = None
    last_date: str | None = None
    number_cells: int = 0
    text_cells: Counter | None = field(default_factory=Counter)
    monotone: bool = True
    _last: float | None = field(default=None, repr=False)
    _direction: int = field(default=0, repr=False)
    _valid_dates: set[str] = field(default_factory=set, repr=False)

    def add(self, raw: str, missing_values: Iterable[str] = DEFAULT_MISSING_VALUES) -> None:
        """Account one cell (raw text). Raises ``CellError`` if it does not fit ``declared``."""
        self.add_batch([raw], frozenset(missing_values))

    def add_batch(
        self, cells: Sequence[str], missing: frozenset[str] = frozenset(DEFAULT_MISSING_VALUES)
    ) -> None:
        """Account a batch of cells (raw text) of this column.

        Raises ``CellError`` (with the index into ``cells``) at the first value that does not
        fit ``declared``; the column's summaries are then unspecified (the ingest is aborted).
        Category counts are kept only while the column is untyped, ``bool`` or ``str``; a
        column that turns ``str`` after numeric or date values has none (``None``).
        """
        target = self.declared
        current = self.type
        hint = target or current
        if hint in (None, "int", "float") and self._numbers_fast(cells, missing, target):
            return
        values = strip_all(cells)
        present = values if missing.isdisjoint(values) else [v for v in values if v not in missing]
        self.missing += len(values) - len(present)
        if not present:
            return
        self.count += len(present)
        if hint == "str":
            self.type = "str"
            self._count_categories(present)
            self._tally_text(Counter(present))
            return
        kind, numbers, distinct = _batch_kind(present, hint, self._all_dates)
        if kind in NUMERIC_TYPES:
            self.number_cells += len(present)
        else:
            self._tally_text(Counter(present))
        if target is not None:
            if kind not in ACCEPTS[target]:
                raise CellError(max(first_misfit(values, missing, target), 0), target)
            new = target
        else:
            new = widen(current, kind)
        self.type = new
        if new in NUMERIC_TYPES and numbers is not None:
            self._merge_numbers(numbers)
        else:
            self._account_values(new, current, distinct or set(present), present)

    def native_shape(self, numeric_markers: bool) -> str:
        """The ``sandbox.arrowcsv`` shape to ask for this column's next batch: ``"int"`` or
        ``"float"`` while it is (or is declared) numeric — unless a missing-value marker is a
        number (``numeric_markers``; module doc of ``arrowcsv``) — else ``"dict"``."""
        hint = self.declared or self.type
        if hint in NUMERIC_TYPES and not numeric_markers:
            return hint
        return "dict"

    def add_native(self, cells, missing: frozenset[str], neg_zero: Callable[[], bool]) -> bool:
        """Account a batch of cells held as a ``pyarrow`` array of a ``sandbox.arrowcsv``
        shape, with exactly the outcome of ``add_batch`` on the same cells as strings;
        ``missing`` are the stripped missing-value markers; ``neg_zero()`` tells whether the
        block may hold a ``-0`` cell (an ``int`` array has lost its sign; that matters to the
        mean only when every value is zero, and ``min``/``max`` may then hold ``0.0`` for
        ``-0.0``: they are not part of the profile).

        Returns ``False`` — having changed nothing but a cache of validated dates — when the
        batch needs the Python rules (a value that does not fit ``declared``, a numeric column
        turning to text, a number that is not finite, ``-0`` among zeros only); the caller
        then calls ``add_batch`` with the cells as strings, which also raises the exact
        ``CellError``.
        """
        target = self.declared
        current = self.type
        hint = target or current
        shape = arrowcsv.shape_of(cells)
        if shape != "dict":
            values = arrowcsv.numbers(cells)
            present = arrowcsv.valid(cells)
            if present is not None:
                values = values[present]
            if not np.isfinite(values).all():
                return False
            if shape == "int" and len(values) and not values.any() and neg_zero():
                return False  # all zeros, some maybe "-0": their sum's sign needs the text
            # "float": the column is (declared) float already, so the batch's own kind
            # (int or float) does not change its type.
            kind = shape
            if target is not None and kind not in ACCEPTS[target]:
                return False
            self.missing += len(cells) - len(values)
            if len(values):
                self.count += len(values)
                self.number_cells += len(values)
                self.type = target or widen(current, kind)
                self._merge_numbers(values)
            return True
        raw_values, index = arrowcsv.dictionary(cells)
        stripped = strip_all(raw_values)
        counts = np.bincount(index, minlength=len(raw_values)).tolist()
        n_missing = 0
        if stripped is raw_values and missing.isdisjoint(raw_values):
            # nothing to strip, no marker: the dictionary's values are distinct already
            tally = dict(zip(raw_values, counts, strict=True))
            if 0 in tally.values():
                tally = {value: count for value, count in tally.items() if count}
        else:
            tally = {}
            for value, count in zip(stripped, counts, strict=True):
                if not count:
                    continue
                if value in missing:
                    n_missing += count
                else:
                    tally[value] = tally.get(value, 0) + count
        n_present = len(cells) - n_missing
        if n_present == 0:
            self.missing += n_missing
            return True
        if hint == "str":
            self.missing += n_missing
            self.count += n_present
            self.type = "str"
            self._count_categories(tally)
            self._tally_text(tally)
            return True
        distinct = set(tally)
        if hint in (None, "int", "float"):
            # every distinct cell as a number (a missing one as 0: it is left out below)
            parsed = numbers_of([v if v in tally else "0" for v in stripped])
            if parsed is not None:
                quick, floats = parsed
                if target is not None and quick not in ACCEPTS[target]:
                    return False
                keep = np.array([v in tally for v in stripped], dtype=bool)[index]
                self.missing += n_missing
                self.count += n_present
                self.number_cells += n_present
                self.type = target or widen(current, quick)
                self._merge_numbers(floats[index][keep])
                return True
            if hint is not None:
                return False
        kind = infer_kind(distinct, dates=self._all_dates)
        if kind in NUMERIC_TYPES:
            return False
        if target is not None and kind not in ACCEPTS[target]:
            return False
        new = target or widen(current, kind)
        self.missing += n_missing
        self.count += n_present
        self.type = new
        self._tally_text(tally)
        self._account_values(new, current, distinct, tally)
        return True

    def _account_values(
        self,
        new: str,
        current: str | None,
        distinct: set[str],
        present: Sequence[str] | Mapping[str, int],
    ) -> None:
        """After a batch that left the column ``new`` (was ``current``): the date range of a
        ``date`` column, else (``bool``/``str``) the category counts of ``present`` (values,
        or value → count), dropped when earlier numbers or dates were not counted."""
        if new == "date":
            low, high = min(distinct), max(distinct)
            self.first_date = low if self.first_date is None else min(self.first_date, low)
            self.last_date = high if self.last_date is None else max(self.last_date, high)
            return
        if current in ("int", "float", "date"):
            self.categories = None  # the earlier values were not counted
        self._count_categories(present)

    def _all_dates(self, distinct: set[str]) -> bool:
        """``is_date_batch`` with this column's cache of validated dates (bounded)."""
        valid_dates = self._valid_dates
        unseen = distinct - valid_dates
        if not is_date_batch(unseen):
            return False
        if len(valid_dates) + len(unseen) > MAX_TRACKED_DISTINCT:
            valid_dates.clear()
        valid_dates.update(unseen)
        return True

    def _numbers_fast(self, cells: Sequence[str], missing: frozenset[str], target) -> bool:
        """Account a batch that is entirely numbers without stripping or set lookups: no missing
        marker may be something ``float()`` accepts, ``numeric_kind`` must pass and every cell
        must parse to a finite number (an empty or blank cell does not). ``False``: nothing was
        counted, use the general path."""
        if any(parses_as_float(marker) for marker in missing):
            return False
        parsed = numbers_of(cells)
        if parsed is None or (target is not None and parsed[0] not in ACCEPTS[target]):
            return False
        quick, numbers = parsed
        self.count += len(cells)
        self.number_cells += len(cells)
        self.type = target or widen(self.type, quick)
        self._merge_numbers(numbers)
        return True

    def _count_categories(self, present: Sequence[str] | Mapping[str, int]) -> None:
        """Add ``present`` (values, or a mapping value → count) to the category counts."""
        categories = self.categories
        if categories is None:
            return
        before = len(categories)
        categories.update(present)
        grown = len(categories) != before
        too_many = len(categories) > MAX_TRACKED_DISTINCT
        if too_many or (grown and max(map(len, categories)) > MAX_CATEGORY_LENGTH):
            self.categories = None

    def _tally_text(self, tally: Mapping[str, int]) -> None:
        """Split ``tally`` (value → cells) into numbers and text (``number_cells``,
        ``text_cells``), keeping text values only while there are few of them."""
        text = self.text_cells
        if text is None:
            return
        for value, count in tally.items():
            if classify_value(value, ()) in NUMERIC_TYPES:
                self.number_cells += count
            else:
                text[value] += count
        if len(text) > MAX_TEXT_VALUES:
            self.text_cells = None

    def numeric_but_text(self) -> tuple[int, list[tuple[str, int]]] | None:
        """For a column inferred as text although most of its values are numbers: ``(cells that
        are not numbers, [(value, cells)] most frequent first)``; else ``None``."""
        if self.declared is not None or self.final_type != "str" or not self.text_cells:
            return None
        not_numbers = sum(self.text_cells.values())
        if self.number_cells == 0 or self.number_cells < not_numbers:
            return None
        return not_numbers, sorted(self.text_cells.items(), key=lambda vc: (-vc[1], vc[0]))

    def _merge_numbers(self, numbers: np.ndarray) -> None:
        if self.monotone and len(numbers):
            steps = np.diff(numbers)
            if self._last is not None:
                steps = np.concatenate([[numbers[0] - self._last], steps])
            if len(steps):
                direction = self._direction or (1 if steps[0] > 0 else -1)
                if (direction > 0 and not (steps > 0).all()) or (
                    direction < 0 and not (steps < 0).all()
                ):
                    self.monotone = False
                self._direction = direction
            self._last = float(numbers[-1])
        # Chan, Golub & LeVeque 1979: combine (n, mean, M2) of the batch with the running ones.
        n_b = len(numbers)
        mean_b = float(numbers.mean())
        m2_b = float(np.square(numbers - mean_b).sum())
        n_a = self.numeric_count
        total = n_a + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / total
        self.m2 += m2_b + delta * delta * n_a * n_b / total
        self.numeric_count = total
        self.min = min(self.min, float(numbers.min()))
        self.max = max(self.max, float(numbers.max()))

    @property
    def final_type(self) -> str:
        return self.declared or self.type or "str"


def _batch_kind(
    present: Sequence[str], hint: str | None, dates: Callable[[Iterable[str]], bool]
) -> tuple[str, np.ndarray | None, set[str] | None]:
    """``(kind, float values if numeric, distinct values if computed)`` of non-missing values,
    by the rule of ``csvformat.infer_kind``: the cheap whole-batch number test first while the
    column is (or may be) numeric (``hint``), then the distinct values. ``dates`` is the
    column's cached ``is_date_batch``, since a date column repeats the same few thousand days.
    """
    if hint in (None, "int", "float"):
        parsed = numbers_of(present)
        if parsed is not None:
            return parsed[0], parsed[1], None
    distinct = set(present)
    kind = infer_kind(distinct, dates=dates)
    if kind in NUMERIC_TYPES:
        return kind, parse_floats(present), distinct
    return kind, None, distinct


def safe_count(n: int) -> int | str:
    """Disclosure-controlled count (module doc): 0 stays 0, 1..7 → ``"≤7"``, else rounded to the
    nearest multiple of 5 (halves up: 12 → 10, 13 → 15)."""
    if n == 0:
        return 0
    if n <= SMALL_COUNT:
        return SUPPRESSED
    return (n + ROUNDING_BASE // 2) // ROUNDING_BASE * ROUNDING_BASE


def released_count(n: int) -> int:
    """``safe_count(n)`` as a number, for figures computed from counts as released (a site's
    data-volume share, a pooled total): ``0``, ``SUPPRESSED_STANDS_FOR`` (4) for ``"≤7"``, else
    ``n`` rounded to the nearest multiple of 5. A ratio or sum of exact counts gives the counts
    back to whoever knows one of them (``rows_B = share_B / share_A × rows_A``); one of released
    counts gives back only released counts (issue 9, finding 5)."""
    shown = safe_count(n)
    return SUPPRESSED_STANDS_FOR if shown == SUPPRESSED else int(shown)


def released_parts(counts: Iterable[int]) -> tuple[int, int]:
    """``(sum of the released counts that are numbers, how many are "≤7")`` of ``counts``
    (``safe_count`` of each): a total as researchers may see it is built from these, never from
    the rule applied to the exact total (the rule on a sum that holds one's own exact count, or
    on rounds × rows, gives the other count back)."""
    shown = [safe_count(int(n)) for n in counts]
    return sum(s for s in shown if s != SUPPRESSED), sum(1 for s in shown if s == SUPPRESSED)


def released_total(counts: Iterable[int]) -> int | str:
    """A total of ``counts`` from their released values (``released_parts``): an ``int`` when none
    is suppressed (``[157, 39] → 155 + 40 = 195``), ``"≤14"`` when all of two are, ``"195 + ≤7"``
    for both kinds. Tells nothing the released counts do not."""
    total, small = released_parts(counts)
    if not small:
        return total
    bound = f"≤{small * SMALL_COUNT}"
    return f"{total} + {bound}" if total else bound


def released_floor(n: int) -> int:
    """The smallest count that shows as ``safe_count(n)`` does: ``0`` for 0, ``1`` for 1–7
    (``"≤7"``), else the released figure less 2 (the rule rounds to the nearest 5, halves up:
    ``"≈115"`` is any of 113–117). A function of the released count alone."""
    shown = safe_count(int(n))
    if shown == SUPPRESSED:
        return 1
    return max(int(shown) - ROUNDING_BASE // 2, 0)


def released_fraction(value: float | None, counts: int | Iterable[int]) -> float | None:
    """A fraction over a count of rows (an accuracy over a site's held-out rows, a majority-class
    rate; ``counts`` a list for one pooled over sites: the sum of theirs) as those who see the
    counts only released may see it: ``value`` snapped to the nearest multiple of ``1 / L``,
    ``L`` the sum of the counts' :func:`released_floor`. ``None`` when ``value`` is ``None`` or
    not finite, or ``L`` is at most ``SMALL_COUNT`` (the counts show as "≤7" or 0: a fraction
    over them would say which).

    Why it tells nothing the released counts do not (issue 9; ADR 0036, amendment): a fraction
    ``k / n`` at full precision gives ``n`` back (the continued-fraction expansion of
    0.982456… = 112/114 gives 114 where the page shows "≈115"). Every total ``n'`` the released
    counts allow is at least ``L``, so the fractions ``k' / n'`` lie at most ``1 / L`` apart and
    one of them rounds to the shown value: the shown value holds for every count the released
    ones allow, and its own expansion gives ``L``, a function of the released counts. The value
    moves by at most ``1 / (2L)`` — half a held-out row or less."""
    if value is None or not math.isfinite(value):
        return None
    total = sum(released_floor(n) for n in ([counts] if isinstance(counts, int) else counts))
    if total <= SMALL_COUNT:
        return None
    return round(float(value) * total) / total


def released_measure(value: float | None) -> float | None:
    """A mean of measured values (a loss, an RMSE, R²) as everyone may see it: 3 significant
    figures, as the profile gives a numeric column's mean and std. ``None`` for ``None`` or a
    value that is not finite."""
    if value is None or not math.isfinite(value):
        return None
    return _sig3(float(value))


def _sig3(x: float) -> float:
    return float(f"{x:.3g}")


def _identifier_like(col: ColumnStats, row_count: int) -> bool:
    kind = col.final_type
    if row_count < 2 or col.count != row_count:
        return False
    if kind == "int":
        return col.monotone
    if kind == "str":
        return col.categories is None or all(c == 1 for c in col.categories.values())
    return False


def compute_profile(columns: list[ColumnStats], row_count: int) -> dict:
    """Build the disclosure-controlled profile from running column summaries.

    Returns ``{"format": 2, "rows": safe_count(row_count), "columns": [per column]}``; each
    column: ``{"name", "type", "type_source" ("inferred"|"override"), "missing", "count"}``
    (counts through ``safe_count``) plus

    * ``int``/``float``: ``"mean", "std"`` (sample, n-1) to 3 significant figures, ``None`` when
      7 or fewer values exist. No minimum or maximum: each is one record's value, which output
      checking withholds (the ``ColumnStats`` keep them for validation only);
    * ``str``/``bool``: ``"categories": [{"value", "count"}]`` — only values held by more than 7
      rows, at most 20, most frequent first (``bool`` values as ``"true"``/``"false"``) — and
      ``"other"`` (``safe_count`` of the remaining values); ``"categories"``/``"other"`` are
      ``None`` for free-text columns with more than 10 000 distinct or over-long values;
    * ``date``: ``"min_year", "max_year"`` (``None`` when 7 or fewer values exist);
    * every column: ``"identifier"`` — true when the column looks like a row identifier (an
      ``int`` column strictly monotone in file order with a value in every row; a text column
      whose values are all distinct, or too many to count), so that the job form does not offer
      it as a feature by default; ``"not_numbers"`` — for a text column whose values are mostly
      numbers, ``safe_count`` of the cells that are not (an undeclared missing-value marker,
      typically), else absent.

    A list, not a dict, so column order survives jsonb.
    """
    out = []
    for col in columns:
        kind = col.final_type
        entry: dict = {
            "name": col.name,
            "type": kind,
            "type_source": "override" if col.declared else "inferred",
            "missing": safe_count(col.missing),
            "count": safe_count(col.count),
            "identifier": _identifier_like(col, row_count),
        }
        text_instead = col.numeric_but_text()
        if text_instead is not None:
            entry["not_numbers"] = safe_count(text_instead[0])
        enough = col.count > SMALL_COUNT
        if kind in NUMERIC_TYPES:
            n = col.numeric_count
            std = math.sqrt(col.m2 / (n - 1)) if n > 1 else 0.0
            summary = {"mean": col.mean, "std": std}
            for key, value in summary.items():
                entry[key] = _sig3(value) if enough and n and math.isfinite(value) else None
        elif kind == "date":
            entry["min_year"] = int(col.first_date[:4]) if enough and col.first_date else None
            entry["max_year"] = int(col.last_date[:4]) if enough and col.last_date else None
        elif col.categories is None:
            entry["categories"] = None
            entry["other"] = None
        else:
            counts: Mapping[str, int] = col.categories
            if kind == "bool":
                merged: Counter = Counter()
                for value, count in col.categories.items():
                    merged[value.lower()] += count
                counts = merged
            frequent = sorted(
                ((v, c) for v, c in counts.items() if c > SMALL_COUNT),
                key=lambda item: (-item[1], item[0]),
            )[:MAX_CATEGORIES]
            entry["categories"] = [{"value": v, "count": safe_count(c)} for v, c in frequent]
            entry["other"] = safe_count(col.count - sum(c for _, c in frequent))
        out.append(entry)
    return {"format": PROFILE_FORMAT, "rows": safe_count(row_count), "columns": out}

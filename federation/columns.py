"""The columns a job may use: those every chosen dataset version has, with their types, missing
counts (from the disclosure-controlled profiles) and the careful defaults of the job form.

One place for the rules the form shows and ``job_submit`` applies:

* **Task**: the target's type decides — ``float`` → regression (linear regression), ``int``,
  ``bool`` or ``str`` → classification; a ``date`` target is refused.
* **Kind**: ``int``/``float``/``bool`` columns are numeric (an ``int`` may be made categorical),
  ``str`` columns categorical (one-hot over the federated vocabulary), ``date`` columns are left
  out unless the researcher types them as ``date`` (days since 1970-01-01).
* **Missing values**: numeric and date features get the pooled **median** (robust to skew), with
  a missing-indicator column when a chosen dataset's profile shows missing cells — what
  scikit-learn's ``SimpleImputer(strategy="median", add_indicator=True)`` does; categorical
  features the most frequent category. Rows are dropped only when the researcher says so.
* **Identifier-like** columns are not pre-selected: the profile's ``identifier`` flag (a strictly
  monotone integer column, or a text column with a distinct value in every row) or a name such as
  ``id``, ``patient_id``, ``rownames`` or ``Unnamed: 0``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from frp_flwr.contract import RULES_FOR_KIND, FeaturePlan

_ID_NAME = re.compile(
    r"^(?:id|ids|index|idx|row|rows|rownames?|row_?(?:id|num(?:ber)?|no)|record_?id|"
    r"unnamed:?\s*\d*|\.\.\.\d+|.*[_\s.-]id|\w*_?uuid)$",
    re.IGNORECASE,
)

_CAMEL_ID = re.compile(r"[a-z]ID$")  # PatientID, recordID

KIND_LABELS = {"numeric": "Number", "categorical": "Category (one-hot)", "date": "Date (days)"}
RULE_LABELS = {
    "median": "Median",
    "mean": "Mean",
    "most_frequent": "Most frequent",
    "drop": "Drop row",
}


@dataclass
class Column:
    """One column every chosen dataset has.

    ``type``: the common type (``int`` and ``float`` together are ``float``; any other mix is
    ``str``); ``missing``: per dataset version, its profile's missing count as researchers see it
    (``0``, ``"≤7"``, a multiple of 5) or ``None`` when its profile does not say; ``identifier``:
    identifier-like (module doc); ``kinds``: the kinds it may take; ``note``: why it is not
    offered by default, if it is not.
    """

    name: str
    type: str
    missing: list = field(default_factory=list)
    identifier: bool = False
    kinds: tuple[str, ...] = ()
    note: str = ""

    @property
    def has_missing(self) -> bool:
        return any(m not in (0, None) for m in self.missing)

    @property
    def default_kind(self) -> str:
        return self.kinds[0] if self.kinds else ""

    @property
    def preselected(self) -> bool:
        """Whether the form ticks it by default (a usable feature that is no identifier)."""
        return bool(self.kinds) and not self.identifier and self.type != "date"

    def default_plan(self, kind: str | None = None) -> FeaturePlan:
        """The careful default for this column as ``kind`` (module doc)."""
        kind = kind or self.default_kind
        return FeaturePlan(
            name=self.name,
            kind=kind,
            missing=RULES_FOR_KIND[kind][0],
            indicator=self.has_missing and kind != "categorical",
        )


def _common_type(types: list[str]) -> str:
    kinds = set(types)
    if len(kinds) == 1:
        return types[0]
    if kinds <= {"int", "float"}:
        return "float"
    return "str"


def _kinds(kind: str) -> tuple[str, ...]:
    if kind in ("float", "bool"):
        return ("numeric",)
    if kind == "int":
        return ("numeric", "categorical")
    if kind == "str":
        return ("categorical",)
    if kind == "date":
        return ("date",)
    return ()


def identifier_like(name: str, profile_entry: dict | None) -> bool:
    """Whether a column looks like a row identifier (module doc)."""
    if profile_entry and profile_entry.get("identifier"):
        return True
    name = name.strip()
    return bool(_ID_NAME.match(name) or _CAMEL_ID.search(name))


def common_columns(versions) -> list[Column]:
    """The columns every version in ``versions`` has, in the first version's order."""
    versions = list(versions)
    if not versions:
        return []
    schemas = [{c["name"]: c["type"] for c in v.schema} for v in versions]
    profiles = [
        {c["name"]: c for c in (v.profile or {}).get("columns", []) if isinstance(c, dict)}
        for v in versions
    ]
    out = []
    for entry in versions[0].schema:
        name = entry["name"]
        if not all(name in s for s in schemas):
            continue
        kind = _common_type([s[name] for s in schemas])
        column = Column(
            name=name,
            type=kind,
            missing=[p.get(name, {}).get("missing") for p in profiles],
            identifier=any(identifier_like(name, p.get(name)) for p in profiles),
            kinds=_kinds(kind),
        )
        if column.type == "date":
            column.note = "a date: used only when you type it as Date (days since 1970)"
        elif column.identifier:
            column.note = "looks like a row identifier (unique per row or named like one)"
        elif any(p.get(name, {}).get("not_numbers") for p in profiles):
            column.note = "read as text because of values that are not numbers"
        out.append(column)
    return out


def profile_vocabulary(versions, name: str, *, every_value: bool = False) -> tuple[list[str], bool]:
    """The categories of column ``name`` that the versions' profiles list (each held by more
    than 7 rows of its dataset, ``sandbox.profile``), sorted, and whether that list is complete.

    Complete: every profile lists the column's categories (not ``None`` for free text, nor
    absent for a numeric column) and fewer than ``sandbox.profile.MAX_CATEGORIES`` of them (a
    full list may have left frequent values out); with ``every_value`` (a target's classes, rare
    ones included) also no "other" values. Without complete lists the categories are a lower
    bound.
    """
    from sandbox.profile import MAX_CATEGORIES

    values: set[str] = set()
    complete = True
    for version in versions:
        entry = next(
            (
                c
                for c in (version.profile or {}).get("columns", [])
                if isinstance(c, dict) and c.get("name") == name
            ),
            {},
        )
        listed = entry.get("categories")
        if not isinstance(listed, list):
            complete = False
            continue
        values.update(str(c["value"]) for c in listed if isinstance(c, dict) and "value" in c)
        if len(listed) >= MAX_CATEGORIES or (every_value and entry.get("other") != 0):
            complete = False
    return sorted(values), complete


def task_for(column: Column) -> str:
    """The task a target column decides (module doc); ``ValueError`` for a date target."""
    if column.type == "date":
        raise ValueError("a date column cannot be the target")
    return "regression" if column.type == "float" else "classification"

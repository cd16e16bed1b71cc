"""Site-side loader the Flower ClientApp uses to read its own dataset (imports no Django).

Owns turning a stored, encrypted dataset version into training arrays: fetch the object, decrypt
it whole in memory (plaintext never touches disk), parse it with the CSV rules of
``sandbox.ingest`` (same typing, so the table matches the schema recorded at ingest), and build
``X``/``y`` and a deterministic stratified train/test split with numpy only — no pandas or
scikit-learn import, since the ClientApp pays every import on every Flower message.

Every failure raises ``LoaderError`` whose message names the object key or column but never a
site file path, store host or data value, because ClientApp errors travel to the ServerApp
(store details are logged locally instead).
"""

from __future__ import annotations

import io
import logging
from dataclasses import dataclass, field

import numpy as np

from sandbox.crypto import CryptoError, associated_data, decrypt_all
from sandbox.ingest import ENCODING, IngestError, classify_value, read_csv, widen
from sandbox.storage import ObjectStore, StorageError

logger = logging.getLogger(__name__)


class LoaderError(Exception):
    """The dataset cannot be loaded or turned into training arrays."""


@dataclass
class Table:
    """A decrypted dataset in columns.

    ``columns``: names in file order; ``data[name]``: ``(n,)`` array — ``float64`` for ``int`` and
    ``float`` columns (missing → ``nan``), ``object`` of ``str`` for ``str`` columns (missing →
    ``None``); ``types[name]``: ``"int"``, ``"float"`` or ``"str"`` as inferred at ingest.
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
        return [name for name in self.columns if self.types.get(name) in ("int", "float")]


def load_table(
    *, store: ObjectStore, kek: bytes, store_key: str, site: str, dataset: str, version: int
) -> Table:
    """Fetch ``store_key``, decrypt it in memory with ``kek`` and parse it into a ``Table``.

    ``site``/``dataset``/``version`` must be those the object was ingested under (they form
    the associated data). Memory: ciphertext stream + plaintext + parsed columns.

    Raises ``LoaderError`` if the object is missing or unreadable, fails to decrypt or
    authenticate (wrong key, wrong site/dataset/version, tampered or truncated), or is not a
    valid CSV.
    """
    try:
        aad = associated_data(site=site, dataset=dataset, version=version)
        with store.open(store_key) as stream:
            plaintext = decrypt_all(kek=kek, aad=aad, source=stream)
    except StorageError as exc:
        # The store's message may name site paths or hosts: log it here, send a clean one on.
        logger.warning("cannot read dataset object %r: %s", store_key, exc)
        raise LoaderError(
            f"cannot read dataset object {store_key!r} from the site's object store"
        ) from None
    except CryptoError as exc:
        raise LoaderError(f"cannot decrypt dataset object {store_key!r}: {exc}") from None
    try:
        text = plaintext.decode(ENCODING)
    except UnicodeDecodeError:
        raise LoaderError(f"dataset object {store_key!r} is not valid UTF-8") from None
    del plaintext
    return parse_table(text, where=store_key)


def parse_table(text: str, *, where: str = "dataset") -> Table:
    """Parse CSV text into a ``Table`` with ``sandbox.ingest`` rules. Raises ``LoaderError``."""
    try:
        names, rows = read_csv(io.StringIO(text, newline=""))
        cells: list[list[str]] = [[] for _ in names]
        for row in rows:
            for column, cell in zip(cells, row, strict=True):
                column.append(cell)
    except IngestError as exc:
        raise LoaderError(f"{where}: {exc}") from None
    data: dict[str, np.ndarray] = {}
    types: dict[str, str] = {}
    for name, values in zip(names, cells, strict=True):
        kind: str | None = None
        for value in values:
            seen = classify_value(value)
            if seen is not None:
                kind = widen(kind, seen)
                if kind == "str":
                    break
        kind = kind or "str"
        types[name] = kind
        if kind == "str":
            column = np.empty(len(values), dtype=object)
            column[:] = [value.strip() or None for value in values]
        else:
            column = np.array(
                [float(value) if value.strip() else np.nan for value in values], dtype=np.float64
            )
        data[name] = column
    return Table(columns=list(names), data=data, types=types)


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

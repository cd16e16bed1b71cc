"""Demo data: scikit-learn's bundled Wisconsin diagnostic breast-cancer set split across hospitals.

The split is deliberately not IID — a label skew: each hospital sees a different share of malignant and
benign cases (``MALIGNANT_SHARE`` / ``BENIGN_SHARE``), as referral centres do. Each part is written as
a CSV with snake_case feature names, a string target ``diagnosis`` (``malignant`` / ``benign``) and a
``patient_ref`` identifier column that is never a feature. Imports no Django; the data ships with
scikit-learn (no download).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

SITES = ("hospital-a", "hospital-b", "hospital-c")
MALIGNANT_SHARE = (0.60, 0.30, 0.10)
BENIGN_SHARE = (0.15, 0.35, 0.50)


def _snake(name: str) -> str:
    return name.strip().lower().replace(" ", "_")


def split_breast_cancer(
    sites: tuple[str, ...] = SITES, *, seed: int = 7
) -> dict[str, tuple[list[str], np.ndarray, np.ndarray]]:
    """Return site → ``(feature_names, X (n, 30) float64, y (n,) str)`` with the label skew above
    (more than three sites: each class split in equal shares). Every row goes to one site."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    names = [_snake(n) for n in data.feature_names]
    labels = np.array(["malignant", "benign"])[data.target]  # sklearn: 0 = malignant, 1 = benign
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in sites}
    for label, shares in (("malignant", MALIGNANT_SHARE), ("benign", BENIGN_SHARE)):
        idx = rng.permutation(np.flatnonzero(labels == label))
        if len(sites) > len(shares):  # more sites than the demo's three: equal shares
            shares = (1 / len(sites),) * len(sites)
        cuts = np.cumsum(np.round(np.array(shares[: len(sites)]) * len(idx)).astype(int))[:-1]
        for site, chunk in zip(sites, np.split(idx, cuts), strict=True):
            parts[site].append(chunk)
    out = {}
    for site in sites:
        idx = np.sort(np.concatenate(parts[site]))
        out[site] = (names, data.data[idx], labels[idx])
    return out


def write_site_csvs(
    out_dir: Path, sites: tuple[str, ...] = SITES, *, seed: int = 7, canary: str | None = None
) -> dict[str, Path]:
    """Write one CSV per site under ``out_dir/<site>/breast_cancer.csv``; return site → path.

    ``canary``, when given, is planted as the ``patient_ref`` of the first row of the first site (for
    the data-residency test: it must never appear outside that site).
    """
    paths = {}
    for n_site, (site, (names, X, y)) in enumerate(split_breast_cancer(sites, seed=seed).items()):
        path = out_dir / site / "breast_cancer.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["patient_ref", *names, "diagnosis"])
            for i, (row, label) in enumerate(zip(X, y, strict=True)):
                ref = (
                    canary if (canary and n_site == 0 and i == 0) else f"{site[-1].upper()}-{i:05d}"
                )
                writer.writerow([ref, *(f"{v:.6g}" for v in row), label])
        paths[site] = path
    return paths

"""The demo's breast-cancer split: every row at exactly one site, for 2, 3 or more sites."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from sandbox.demo_data import split_breast_cancer


@pytest.mark.parametrize("n", [2, 3, 10])
def test_every_row_goes_to_one_site(n):
    sites = tuple(f"site-{i}" for i in range(n))
    parts = split_breast_cancer(sites)
    X = np.vstack([parts[s][1] for s in sites])
    assert set(parts) == set(sites) and all(len(parts[s][1]) for s in sites)
    whole = load_breast_cancer().data
    assert len(X) == len(whole)
    assert np.array_equal(np.unique(X, axis=0), np.unique(whole, axis=0))

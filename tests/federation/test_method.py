"""``federation.method``, the one wording of a job's method that the job page and the credit
statement share: ε at δ, the DP mode, the training line and the method document (no database:
the functions take any object with a job's fields)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from federation import method


def _job(**fields) -> SimpleNamespace:
    base = {
        "task": "classification",
        "model_spec": {},
        "strategy_spec": {},
        "num_rounds": 4,
        "local_epochs": 2,
        "learning_rate": 0.3,
        "privacy": {},
        "epsilon": None,
        "secure_aggregation": False,
    }
    return SimpleNamespace(**(base | fields))


@pytest.mark.parametrize(
    ("epsilon", "delta", "text"),
    [
        (2.9134, 1e-5, "ε = 2.91 at δ = 1e-5"),
        (0.51234, 1e-6, "ε = 0.512 at δ = 1e-6"),
        (12.345, 0.001, "ε = 12.3 at δ = 0.001"),
    ],
)
def test_epsilon_text_three_significant_digits_delta_shortest(epsilon, delta, text):
    assert method.epsilon_text(epsilon, delta) == text


def test_privacy_text_off_is_empty_and_on_names_the_mode():
    dp = {"dp": "server", "noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 1e-5}

    assert method.privacy_text(_job()) == ""
    assert method.privacy_text(_job(privacy=dp, epsilon=2.9134)) == (
        "ε = 2.91 at δ = 1e-5, server-side fixed clipping"
    )
    assert method.dp_text(_job(privacy=dp | {"dp": "client"}, epsilon=1.0)) == (
        "client-side fixed clipping"
    )


def test_training_text_counts_and_trees_give_rounds_only():
    assert method.training_text(1, 1, 0.1) == "1 round, 1 local epoch, site learning rate 0.1"
    assert method.training_text(4, None, None) == "4 rounds"


def test_method_document_of_an_old_job_is_linear_fedavg_without_privacy():
    doc = method.method_document(_job())

    assert doc == {
        "task": "classification",
        "model": {"kind": "linear", "params": {}, "description": "logistic (softmax) regression"},
        "strategy": {"name": "fedavg", "params": {}, "description": "FedAvg"},
        "training": {
            "rounds": 4,
            "local_epochs": 2,
            "learning_rate": 0.3,
            "description": "4 rounds, 2 local epochs, site learning rate 0.3",
        },
        "privacy": None,
        "secure_aggregation": False,
    }


def test_module_imports_no_django():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(method.__file__).resolve().parents[1]
    code = "import sys, federation.method; print(sorted(m for m in sys.modules if 'django' in m))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )

    assert out.stdout.strip() == "[]"

"""The ServerApp's contribution evaluation (``server_app.evaluate_contribution``) over a fake Grid.

The Grid stands in for the SuperLink: it answers each ``evaluate.coalitions`` message as a site would
(scoring every stacked model on that site's own held-out data with ``task.loss_and_accuracy``).
Expected utilities come from an independent computation: each coalition model scored on each
site's held-out rows, and the median over the sites of those accuracies (ADR 0024: a site's scores
of coalitions that include itself cannot be verified, so no single site decides the utility).
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

sys.path.insert(0, str(Path(__file__).parents[2] / "federation/flwr_app"))
from frp_flwr import server_app, task  # noqa: E402
from frp_flwr.coalitions import coalition_key  # noqa: E402


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """What a ServerApp process has set when it builds messages (the run it serves)."""
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 7), ("_task_id", 1), ("_node_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value, raising=False)


class SiteGrid:
    """Pushes record the messages; pulls answer them as the site behind each node would."""

    def __init__(
        self,
        data: dict[int, tuple[np.ndarray, np.ndarray]],
        failing: set[int] = (),
        task_name: str = "classification",
    ):
        self.data = data
        self.failing = set(failing)
        self.task = task_name
        self.pushed: list[Message] = []

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            self.pushed.append(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, ids):
        replies = []
        for msg in [m for m in self.pushed if m.metadata.message_id in set(ids)]:
            node = msg.metadata.dst_node_id
            if node in self.failing:
                continue  # never answers: times out
            X, y = self.data[node]
            models = task.unstack_models(msg.content["models"].to_numpy_ndarrays())
            scores = [task.loss_and_accuracy(m, X, y, task=self.task) for m in models]
            metrics = MetricRecord(
                {
                    "num-examples": len(y),
                    "coalition-loss": [s[0] for s in scores],
                    "coalition-accuracy": [s[1] for s in scores],
                    "bytes-received": 1,
                    "bytes-sent": 0,
                    "cpu-seconds": 0.0,
                    "wall-seconds": 0.0,
                }
            )
            replies.append(Message(RecordDict({"metrics": metrics}), reply_to=msg))
        return replies


def _world():
    rng = np.random.default_rng(4)
    d, c = 3, 2
    w_true = rng.normal(size=(d, c))

    def make(n):
        X = rng.normal(size=(n, d))
        return X, (X @ w_true).argmax(axis=1)

    train = {i: make(n) for i, n in enumerate((30, 60, 15))}
    held_out = {101: make(7), 102: make(23), 103: make(11)}  # node id → site's test split
    initial = task.init_params(d, c)
    weights, logs = [a.copy() for a in initial], []
    for rnd in (1, 2):
        updates = {
            i: task.train_sgd(weights, X, y, epochs=1, learning_rate=0.3, batch_size=8, seed=rnd)[0]
            for i, (X, y) in train.items()
        }
        counts = {i: len(y) for i, (_, y) in train.items()}
        logs.append(
            task.RoundLog(start=[a.copy() for a in weights], updates=updates, examples=counts)
        )
        weights = task.coalition_run_model(weights, logs[-1:], frozenset(train))
    return initial, logs, held_out


def _median_accuracy(model, held_out: dict) -> float:
    return float(np.median([task.loss_and_accuracy(model, X, y)[1] for X, y in held_out.values()]))


def test_utilities_are_the_median_over_sites_of_each_coalition_models_accuracy():
    initial, logs, held_out = _world()
    grid = SiteGrid(held_out)
    active = {"a": 101, "b": 102, "c": 103}

    out = server_app.evaluate_contribution(
        grid=grid,
        players=["a", "b", "c"],
        initial=initial,
        rounds=logs,
        active=active,
        config=ConfigRecord({"classes": ["0", "1"]}),
        timeout=5,
        poll=0.01,
    )

    assert len(grid.pushed) == 3 and {m.metadata.message_type for m in grid.pushed} == {
        "evaluate.coalitions"
    }
    for members in [(), (0,), (2,), (0, 2), (0, 1, 2)]:
        model = task.coalition_run_model(initial, logs, frozenset(members))
        expected = _median_accuracy(model, held_out)
        assert out.utilities["0"][coalition_key(frozenset(members))] == pytest.approx(expected)
    round_2 = task.coalition_round_model(logs[1], frozenset({1}))
    assert out.utilities["2"]["1"] == pytest.approx(_median_accuracy(round_2, held_out))
    assert set(out.disagreement) == {"a", "b", "c"}
    assert out.models == 8 * 3 and len(out.utilities) == 3
    assert out.examples == {"a": 7, "b": 23, "c": 11}
    assert out.method == "exact" and out.errors == {}


def test_a_silent_site_is_left_out_and_named():
    initial, logs, held_out = _world()
    grid = SiteGrid(held_out, failing={103})

    out = server_app.evaluate_contribution(
        grid=grid,
        players=["a", "b", "c"],
        initial=initial,
        rounds=logs,
        active={"a": 101, "b": 102, "c": 103},
        config=ConfigRecord({}),
        timeout=0.3,
        poll=0.01,
    )

    assert set(out.examples) == {"a", "b"} and "c" in out.errors
    full = task.coalition_run_model(initial, logs, frozenset({0, 1, 2}))
    answered = {n: held_out[n] for n in (101, 102)}
    assert out.utilities["0"]["0,1,2"] == pytest.approx(_median_accuracy(full, answered))


def test_no_site_answering_fails_the_evaluation():
    initial, logs, held_out = _world()
    grid = SiteGrid(held_out, failing={101, 102, 103})

    with pytest.raises(server_app.JobFailed, match="no site scored"):
        server_app.evaluate_contribution(
            grid=grid,
            players=["a", "b", "c"],
            initial=initial,
            rounds=logs,
            active={"a": 101, "b": 102, "c": 103},
            config=ConfigRecord({}),
            timeout=0.2,
            poll=0.01,
        )


def test_regression_utility_is_the_median_of_the_sites_negative_rmse_of_each_coalition_model():
    rng = np.random.default_rng(9)
    w_true = rng.normal(size=(3, 1))

    def make(n):
        X = rng.normal(size=(n, 3))
        return X, (X @ w_true)[:, 0] + rng.normal(0, 0.1, n)

    train = {i: make(n) for i, n in enumerate((40, 25))}
    held_out = {201: make(9), 202: make(21)}
    initial = task.init_params(3, 1)
    updates = {
        i: task.train_sgd(
            initial, X, y, epochs=2, learning_rate=0.1, batch_size=8, seed=1, task="regression"
        )[0]
        for i, (X, y) in train.items()
    }
    logs = [task.RoundLog(start=initial, updates=updates, examples={0: 40, 1: 25})]

    out = server_app.evaluate_contribution(
        grid=SiteGrid(held_out, task_name="regression"),
        players=["a", "b"],
        initial=initial,
        rounds=logs,
        active={"a": 201, "b": 202},
        config=ConfigRecord({"classes": [""]}),
        timeout=5,
        poll=0.01,
        task="regression",
    )

    for members in [(), (0,), (1,), (0, 1)]:
        model = task.coalition_run_model(initial, logs, frozenset(members))
        # each site's own negative RMSE; the utility is their median (ADR 0024), here of two sites
        per_site = [
            -float(np.sqrt(np.mean((task.predict(model, X) - y) ** 2)))
            for X, y in held_out.values()
        ]
        expected = float(np.median(per_site))
        assert out.utilities["0"][coalition_key(frozenset(members))] == pytest.approx(expected)
    assert out.utilities["0"]["0,1"] > out.utilities["0"][""]  # training helps
    assert out.utility == (
        "median over the evaluating sites of negative held-out RMSE (standardised target)"
    )

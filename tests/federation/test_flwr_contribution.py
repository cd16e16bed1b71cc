"""The ServerApp's contribution evaluation (``server_app.evaluate_contribution``) over a fake Grid.

The Grid stands in for the SuperLink: it answers each ``evaluate.coalitions`` message as a site would
(scoring every stacked model on that site's own held-out data with ``task.loss_and_accuracy``).
Expected utilities come from an independent computation: a model's accuracy on all sites' held-out
rows pooled together equals the example-weighted mean of the sites' accuracies.
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

    def __init__(self, data: dict[int, tuple[np.ndarray, np.ndarray]], failing: set[int] = ()):
        self.data = data
        self.failing = set(failing)
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
            scores = [task.loss_and_accuracy(m, X, y) for m in models]
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


def test_utilities_are_pooled_held_out_accuracy_of_each_coalition_model():
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
    X = np.concatenate([x for x, _ in held_out.values()])
    y = np.concatenate([t for _, t in held_out.values()])
    for members in [(), (0,), (2,), (0, 2), (0, 1, 2)]:
        model = task.coalition_run_model(initial, logs, frozenset(members))
        pooled = task.loss_and_accuracy(model, X, y)[1]
        assert out.utilities["0"][coalition_key(frozenset(members))] == pytest.approx(pooled)
    round_2 = task.coalition_round_model(logs[1], frozenset({1}))
    assert out.utilities["2"]["1"] == pytest.approx(task.loss_and_accuracy(round_2, X, y)[1])
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
    X = np.concatenate([held_out[101][0], held_out[102][0]])
    y = np.concatenate([held_out[101][1], held_out[102][1]])
    full = task.coalition_run_model(initial, logs, frozenset({0, 1, 2}))
    assert out.utilities["0"]["0,1,2"] == pytest.approx(task.loss_and_accuracy(full, X, y)[1])


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

"""ClientApp: runs at a site, opens only that site's dataset, trains and evaluates locally.

Three handlers (Flower Message API):

- ``query``  — identify the site (``node_config["site"]``); if the site is part of the job, also return
  its training split's statistics for standardisation (count, mean, M2) and its label set.
- ``train``  — standardise with the federated mean/std, run local SGD, reply with the new weights and
  metered usage (examples, loss, CPU seconds, wall seconds, bytes received and sent).
- ``evaluate`` — loss and accuracy of the global model on the site's held-out split.
- ``evaluate.coalitions`` — after the last round: loss and accuracy of K coalition models (sent
  stacked in one message) on the held-out split, for the portal's Shapley values. Only aggregate
  metrics per coalition leave the site.

Metering: CPU seconds are ``time.process_time()`` (this ClientApp process), wall seconds
``time.perf_counter()``, both around the handler's work. Bytes are :func:`payload_bytes`: the
protobuf-serialised size of the ArrayRecords in the message (what Flower puts on the wire for the
model, without gRPC framing, config and metric records).

Errors are turned into ``SiteDataError`` messages with no file paths before they leave the site.
"""

from __future__ import annotations

import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import array_record_to_proto

from frp_flwr.task import (
    JobSpec,
    SiteDataError,
    encode_labels,
    feature_sums,
    label_keys,
    load_site_data,
    loss_and_accuracy,
    sanitise,
    train_sgd,
    unstack_models,
)

app = ClientApp()


def payload_bytes(content: RecordDict) -> int:
    """Bytes of the model payload of ``content``: Σ over its ArrayRecords of the protobuf size."""
    return sum(
        array_record_to_proto(record).ByteSize()
        for record in content.values()
        if isinstance(record, ArrayRecord)
    )


def _site_data(context: Context):
    spec = JobSpec.from_json(str(context.run_config["job-spec"]))
    data = load_site_data(
        context.node_config,
        spec,
        test_fraction=float(context.run_config["test-fraction"]),
        seed=int(context.run_config["split-seed"]),
    )
    return spec, data


def _standardise(X: np.ndarray, config: ConfigRecord) -> np.ndarray:
    mean = np.asarray(config["feature-mean"], dtype=np.float64)
    std = np.asarray(config["feature-std"], dtype=np.float64)
    return (X - mean) / std


def _guard(handler):
    """Re-raise any failure as a path-free ``SiteDataError`` (Flower forwards the text)."""

    def wrapped(msg: Message, context: Context) -> Message:
        try:
            return handler(msg, context)
        except SiteDataError:
            raise
        except Exception as exc:
            raise SiteDataError(f"{type(exc).__name__}: {sanitise(str(exc))}") from None

    wrapped.__name__ = handler.__name__
    wrapped.__doc__ = handler.__doc__
    return wrapped


@app.query()
@_guard
def query(msg: Message, context: Context) -> Message:
    """Identify this site; when it takes part, return n, mean, M2 and its label set."""
    site = str(context.node_config.get("site", ""))
    spec = JobSpec.from_json(str(context.run_config["job-spec"]))
    info = ConfigRecord({"site": site, "member": site in spec.sites})
    content = RecordDict({"info": info})
    if site in spec.sites:
        _, data = _site_data(context)
        n, mean, m2 = feature_sums(data.X_train)
        info["features"] = data.features
        info["labels"] = label_keys(np.concatenate([data.y_train_raw, data.y_test_raw]))
        content["stats"] = MetricRecord(
            {"num-examples": n, "mean": mean.tolist(), "m2": m2.tolist()}
        )
    return Message(content=content, reply_to=msg)


@app.train()
@_guard
def train(msg: Message, context: Context) -> Message:
    """Local SGD from the global weights; reply with weights and metered usage."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    config = msg.content["config"]
    _, data = _site_data(context)
    X = _standardise(data.X_train, config)
    y = encode_labels(data.y_train_raw, list(config["classes"]))
    params = msg.content["arrays"].to_numpy_ndarrays()
    new_params, loss = train_sgd(
        params,
        X,
        y,
        epochs=int(context.run_config["local-epochs"]),
        learning_rate=float(context.run_config["learning-rate"]),
        batch_size=int(context.run_config["batch-size"]),
        seed=int(config["server-round"]),
    )
    arrays = ArrayRecord(new_params)
    metrics = MetricRecord(
        {
            "num-examples": len(y),
            "train-loss": loss,
            "bytes-received": payload_bytes(msg.content),
            "bytes-sent": payload_bytes(RecordDict({"arrays": arrays})),
            "cpu-seconds": time.process_time() - cpu0,
            "wall-seconds": time.perf_counter() - wall0,
        }
    )
    content = RecordDict({"arrays": arrays, "metrics": metrics})
    return Message(content=content, reply_to=msg)


@app.evaluate()
@_guard
def evaluate(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this site's held-out split."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    config = msg.content["config"]
    _, data = _site_data(context)
    X = _standardise(data.X_test, config)
    y = encode_labels(data.y_test_raw, list(config["classes"]))
    loss, acc = loss_and_accuracy(msg.content["arrays"].to_numpy_ndarrays(), X, y)
    metrics = MetricRecord(
        {
            "num-examples": len(y),
            "eval-loss": loss,
            "eval-accuracy": acc,
            "bytes-received": payload_bytes(msg.content),
            "bytes-sent": 0,
            "cpu-seconds": time.process_time() - cpu0,
            "wall-seconds": time.perf_counter() - wall0,
        }
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


@app.evaluate("coalitions")
@_guard
def evaluate_coalitions(msg: Message, context: Context) -> Message:
    """Score K coalition models (ArrayRecord "models": each layer stacked on axis 0) locally.

    Replies ``coalition-accuracy`` and ``coalition-loss`` (lists of K floats, in the order of the
    config's ``coalition-keys``) and the held-out example count, plus metering.
    """
    wall0, cpu0 = time.perf_counter(), time.process_time()
    config = msg.content["config"]
    _, data = _site_data(context)
    X = _standardise(data.X_test, config)
    y = encode_labels(data.y_test_raw, list(config["classes"]))
    models = unstack_models(msg.content["models"].to_numpy_ndarrays())
    keys = list(config["coalition-keys"])
    if len(keys) != len(models):
        raise SiteDataError(f"{len(models)} coalition models for {len(keys)} coalition keys")
    scores = [loss_and_accuracy(params, X, y) for params in models]
    metrics = MetricRecord(
        {
            "num-examples": len(y),
            "coalition-loss": [loss for loss, _ in scores],
            "coalition-accuracy": [acc for _, acc in scores],
            "bytes-received": payload_bytes(msg.content),
            "bytes-sent": 0,
            "cpu-seconds": time.process_time() - cpu0,
            "wall-seconds": time.perf_counter() - wall0,
        }
    )
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)

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
Every reply is built from the portal contract's reply types (``frp_flwr.contract``).

Received log (an operator's audit, off by default): when the SuperNode's operator sets
``--node-config "received-log='<file>'"``, every message this site receives is appended there as a
JSON line together with the run config and node config it ran under — every byte the SuperNode
hands its ClientApp, readable by the site.
"""

from __future__ import annotations

import json
import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import array_record_to_proto

from frp_flwr.contract import (
    CoalitionReply,
    EvaluateReply,
    FeatureStats,
    RunConfig,
    SiteInfo,
    TrainReply,
)
from frp_flwr.task import (
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


def _plain(value):
    """A record value as JSON: arrays as nested lists, records as dicts, lists as lists."""
    if isinstance(value, ArrayRecord):
        return [a.tolist() for a in value.to_numpy_ndarrays()]
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def log_received(msg: Message, context: Context) -> None:
    """Append what this ClientApp received to the node config's ``received-log`` (if set)."""
    path = str(context.node_config.get("received-log", "") or "")
    if not path:
        return
    entry = {
        "run_id": context.run_id,
        "message_type": msg.metadata.message_type,
        "run_config": _plain(context.run_config),
        "node_config": _plain(context.node_config),
        "content": _plain(msg.content),
    }
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def _site_data(context: Context):
    cfg = RunConfig.from_flower(context.run_config)
    spec = cfg.spec
    data = load_site_data(
        context.node_config, spec, test_fraction=cfg.test_fraction, seed=cfg.split_seed
    )
    return spec, data


def _standardise(X: np.ndarray, config: ConfigRecord) -> np.ndarray:
    mean = np.asarray(config["feature-mean"], dtype=np.float64)
    std = np.asarray(config["feature-std"], dtype=np.float64)
    return (X - mean) / std


def _guard(handler):
    """Re-raise any failure as a path-free ``SiteDataError`` (Flower forwards the text)."""

    def wrapped(msg: Message, context: Context) -> Message:
        log_received(msg, context)
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
    spec = RunConfig.from_flower(context.run_config).spec
    if site not in spec.sites:
        info = SiteInfo(site=site, member=False)
        return Message(content=RecordDict({"info": ConfigRecord(info.as_record())}), reply_to=msg)
    try:
        _, data = _site_data(context)
    except SiteDataError as exc:
        # Said in the reply, attributed to this node by the ServerApp (never by matching text).
        info = SiteInfo(site=site, member=True, error=sanitise(str(exc)))
        return Message(content=RecordDict({"info": ConfigRecord(info.as_record())}), reply_to=msg)
    n, mean, m2 = feature_sums(data.X_train)
    info = SiteInfo(
        site=site,
        member=True,
        features=data.features,
        labels=label_keys(np.concatenate([data.y_train_raw, data.y_test_raw])),
    )
    stats = FeatureStats(num_examples=n, mean=mean.tolist(), m2=m2.tolist())
    content = RecordDict(
        {"info": ConfigRecord(info.as_record()), "stats": MetricRecord(stats.as_record())}
    )
    return Message(content=content, reply_to=msg)


@app.train()
@_guard
def train(msg: Message, context: Context) -> Message:
    """Local SGD from the global weights; reply with weights and metered usage."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    config = msg.content["config"]
    cfg = RunConfig.from_flower(context.run_config)
    _, data = _site_data(context)
    X = _standardise(data.X_train, config)
    y = encode_labels(data.y_train_raw, list(config["classes"]))
    params = msg.content["arrays"].to_numpy_ndarrays()
    new_params, loss = train_sgd(
        params,
        X,
        y,
        epochs=cfg.local_epochs,
        learning_rate=cfg.learning_rate,
        batch_size=cfg.batch_size,
        seed=int(config["server-round"]),
    )
    arrays = ArrayRecord(new_params)
    metrics = TrainReply(
        num_examples=len(y),
        train_loss=loss,
        bytes_received=payload_bytes(msg.content),
        bytes_sent=payload_bytes(RecordDict({"arrays": arrays})),
        cpu_seconds=time.process_time() - cpu0,
        wall_seconds=time.perf_counter() - wall0,
    )
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics.as_record())})
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
    metrics = EvaluateReply(
        num_examples=len(y),
        eval_loss=loss,
        eval_accuracy=acc,
        bytes_received=payload_bytes(msg.content),
        bytes_sent=0,
        cpu_seconds=time.process_time() - cpu0,
        wall_seconds=time.perf_counter() - wall0,
    )
    return Message(content=RecordDict({"metrics": MetricRecord(metrics.as_record())}), reply_to=msg)


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
    metrics = CoalitionReply(
        num_examples=len(y),
        coalition_loss=[loss for loss, _ in scores],
        coalition_accuracy=[acc for _, acc in scores],
        bytes_received=payload_bytes(msg.content),
        bytes_sent=0,
        cpu_seconds=time.process_time() - cpu0,
        wall_seconds=time.perf_counter() - wall0,
    )
    return Message(content=RecordDict({"metrics": MetricRecord(metrics.as_record())}), reply_to=msg)

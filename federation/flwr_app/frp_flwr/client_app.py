"""ClientApp: runs at a site, opens only that site's dataset, trains and evaluates locally.

Handlers (Flower Message API):

- ``query``  — identify the site (``node_config["site"]``); if the site is part of the job, also return
  its label set and per-feature aggregates of its training split (``preprocess.site_summary``).
- ``query.quantiles`` / ``query.design`` — the federated preprocessing's next steps
  (``frp_flwr.preprocess``): cumulative counts for a median; the prepared matrix's column
  statistics for standardisation and what was done to the rows (dropped, imputed).
- ``train``  — (fused rounds, ADR 0032: when the config says ``evaluate-incoming``, first score the
  received global model — the previous round's — on the held-out split, as ``evaluate`` does) then
  prepare the rows with the job's fitted rules (missing values, one-hot categories,
  federated standardisation), run local SGD of the job's model (``frp_flwr.models``: linear or
  MLP, with FedProx's proximal term when the strategy asks), reply with the new
  weights and metered usage (examples, loss, CPU seconds, wall seconds, bytes received and sent).
  A job whose ``model.kind`` is ``xgboost`` boosts trees on top of the global booster instead and
  replies with its new trees only (``frp_flwr.trees``).
  In a secure-aggregation job the same handler runs inside SecAgg+'s mod (``frp_flwr.secagg``):
  its weights leave the site only as a masked delta; its metrics are sent in clear.
- ``evaluate`` — loss and accuracy of the global model on the site's held-out split; after the last
  round also the aggregates of the final metrics (``frp_flwr.metrics``). A fused run sends it once,
  after the last round, with the coalition models beside the final model (scored as
  ``evaluate.coalitions`` does, in the same message).
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

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import array_record_to_proto

from frp_flwr import trees
from frp_flwr.contract import (
    COALITION_ERROR_RECORD,
    COALITIONS_RECORD,
    EVALUATE_INCOMING,
    EVALUATION_RECORD,
    TRAIN_ERROR_RECORD,
    CoalitionReply,
    EvaluateReply,
    RunConfig,
    SiteInfo,
    TrainReply,
    json_record,
)
from frp_flwr.metrics import site_report
from frp_flwr.models import loss_and_accuracy, model_for, predict, predict_proba
from frp_flwr.preprocess import (
    Fitted,
    PreprocessError,
    design_stats,
    site_quantiles,
    site_summary,
    transform,
)
from frp_flwr.privacy import clip_mod
from frp_flwr.secagg import secagg_mod
from frp_flwr.strategies import client_settings
from frp_flwr.task import (
    SiteDataError,
    load_site_frame,
    sanitise,
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


def _frame(context: Context):
    cfg = RunConfig.from_flower(context.run_config)
    spec = cfg.spec
    frame = load_site_frame(
        context.node_config, spec, test_fraction=cfg.test_fraction, seed=cfg.split_seed
    )
    return cfg, spec, frame


def _prepared(context: Context, config: ConfigRecord, part: str):
    """``(run config, fitted rules, prepared part)`` for a train or evaluate message."""
    cfg, _, frame = _frame(context)
    fitted = Fitted.from_text(str(config["preprocess"]))
    try:
        prepared = transform(frame, fitted, part)
    except PreprocessError as exc:
        raise SiteDataError(sanitise(str(exc))) from None
    if fitted.task == "regression":
        prepared.y = (prepared.y - fitted.target_mean) / fitted.target_std
    return cfg, fitted, prepared


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


def _reply(msg: Message, **records) -> Message:
    return Message(content=RecordDict(records), reply_to=msg)


@app.query()
@_guard
def query(msg: Message, context: Context) -> Message:
    """Identify this site; when it takes part, also its labels and first statistics
    (``preprocess.site_summary``: per feature over the training rows, no row)."""
    site = str(context.node_config.get("site", ""))
    spec = RunConfig.from_flower(context.run_config).spec
    if site not in spec.sites:
        info = SiteInfo(site=site, member=False)
        return _reply(msg, info=ConfigRecord(info.as_record()))
    try:
        _, spec, frame = _frame(context)
    except SiteDataError as exc:
        # Said in the reply, attributed to this node by the ServerApp (never by matching text).
        info = SiteInfo(site=site, member=True, error=sanitise(str(exc)))
        return _reply(msg, info=ConfigRecord(info.as_record()))
    summary = site_summary(frame, spec)
    info = SiteInfo(
        site=site, member=True, features=list(frame.values), labels=sorted(summary.labels)
    )
    return _reply(
        msg, info=ConfigRecord(info.as_record()), summary=ConfigRecord(json_record(summary))
    )


@app.query("quantiles")
@_guard
def query_quantiles(msg: Message, context: Context) -> Message:
    """Cumulative counts of the training cells at the ServerApp's grid (federated median)."""
    _, _, frame = _frame(context)
    grids = json.loads(str(msg.content["config"]["grids"]))
    return _reply(msg, quantiles=ConfigRecord(json_record(site_quantiles(frame, grids))))


@app.query("design")
@_guard
def query_design(msg: Message, context: Context) -> Message:
    """The prepared training matrix's column statistics and what was done to the rows."""
    _, _, frame = _frame(context)
    fitted = Fitted.from_text(str(msg.content["config"]["preprocess"]))
    try:
        stats = design_stats(frame, fitted)
    except PreprocessError as exc:
        raise SiteDataError(sanitise(str(exc))) from None
    return _reply(msg, design=ConfigRecord(json_record(stats)))


# SecAgg+ jobs' train messages (frp_flwr.secagg); Flower's fixedclipping_mod for client-side DP
# jobs (frp_flwr.privacy). Each passes other jobs' messages through unchanged.
@app.train(mods=[secagg_mod, clip_mod])
@_guard
def train(msg: Message, context: Context) -> Message:
    """Local SGD of the job's model (``frp_flwr.models``) from the global weights, with the
    strategy's local settings (FedProx's μ, FedOpt's η_l); reply with weights and metered usage.

    Fused rounds (issue 12, ADR 0032): when the config says ``evaluate-incoming``, the received
    global model (the previous round's) is first scored on the held-out split, as the evaluate
    handler would, and the reply carries that too (record ``evaluation``, an ``EvaluateReply``
    whose ``bytes-received`` is 0: the model's bytes are metered once, on the training). A
    training that fails after the evaluation replies the evaluation and the reason (record
    ``train-error``) instead of failing the whole message."""
    config = msg.content["config"]
    evaluation = None
    if bool(config.get(EVALUATE_INCOMING, False)):
        evaluation = _evaluation(msg, context, bytes_received=0)
    try:
        reply = _train(msg, context)
    except Exception as exc:
        if evaluation is None:
            raise
        text = exc.args[0] if isinstance(exc, SiteDataError) and exc.args else None
        reason = sanitise(str(text) if text else f"{type(exc).__name__}: {exc}")
        return _reply(
            msg,
            **{
                EVALUATION_RECORD: MetricRecord(evaluation.as_record()),
                TRAIN_ERROR_RECORD: ConfigRecord({"error": reason}),
            },
        )
    if evaluation is not None:
        reply.content[EVALUATION_RECORD] = MetricRecord(evaluation.as_record())
    return reply


def _train(msg: Message, context: Context) -> Message:
    """The training of :func:`train` (weights and metered usage)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    config = msg.content["config"]
    cfg, fitted, data = _prepared(context, config, "train")
    if cfg.spec.model_kind == "xgboost":  # gradient-boosted trees (frp_flwr.trees)
        return _train_trees(msg, cfg, fitted, data, wall0, cpu0)
    spec = cfg.spec
    learning_rate, mu = client_settings(spec.strategy, cfg.learning_rate)
    params = msg.content["arrays"].to_numpy_ndarrays()
    new_params, loss = model_for(spec.model).train(
        params,
        data.X,
        data.y,
        epochs=cfg.local_epochs,
        learning_rate=learning_rate,
        batch_size=cfg.batch_size,
        seed=int(config["server-round"]),
        task=fitted.task,
        mu=mu,
    )
    arrays = ArrayRecord(new_params)
    metrics = TrainReply(
        num_examples=len(data.y),
        train_loss=loss,
        bytes_received=payload_bytes(RecordDict({"arrays": msg.content["arrays"]})),
        bytes_sent=payload_bytes(RecordDict({"arrays": arrays})),
        cpu_seconds=time.process_time() - cpu0,
        wall_seconds=time.perf_counter() - wall0,
    )
    return _reply(msg, arrays=arrays, metrics=MetricRecord(metrics.as_record()))


def _trees_params(cfg, fitted, config: ConfigRecord) -> dict:
    """XGBoost's parameters of the job (``trees.xgb_params``); the binary ``base_score`` is the
    ServerApp's pooled class share (config ``xgb-base-score``), the seed the round number."""
    return trees.xgb_params(
        trees.model_spec(cfg.spec.model),
        task=fitted.task,
        num_classes=len(fitted.classes),
        base_score=float(config.get("xgb-base-score", 0.5)),
        seed=int(config.get("server-round", 0)),
    )


def _train_trees(msg: Message, cfg, fitted, data, wall0: float, cpu0: float) -> Message:
    """Train hook of ``model.kind == "xgboost"``: ``local_rounds`` boosting rounds on top of the
    global booster (``trees.train_local``); the reply carries only the new trees."""
    config = msg.content["config"]
    packed, loss, _ = trees.train_local(
        trees.booster_bytes(msg.content["arrays"]),
        data.X,
        data.y,
        params=_trees_params(cfg, fitted, config),
        local_rounds=int(trees.model_spec(cfg.spec.model)["local_rounds"]),
    )
    arrays = trees.to_record(packed)
    metrics = TrainReply(
        num_examples=len(data.y),
        train_loss=loss,
        bytes_received=payload_bytes(msg.content),
        bytes_sent=payload_bytes(RecordDict({"arrays": arrays})),
        cpu_seconds=time.process_time() - cpu0,
        wall_seconds=time.perf_counter() - wall0,
    )
    return _reply(msg, arrays=arrays, metrics=MetricRecord(metrics.as_record()))


@app.evaluate()
@_guard
def evaluate(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this site's held-out split; after the last
    round (config ``final``) also the aggregates of ``metrics.site_report``.

    The closing message of a fused run (ADR 0032) may carry the coalition models too (ArrayRecord
    ``models`` and config ``coalition-keys``, as ``evaluate.coalitions``): they are scored after
    the evaluation and replied as record ``coalitions`` (a ``CoalitionReply``); a failure there
    is replied as record ``coalition-error`` and leaves the evaluation standing."""
    evaluation, records = _evaluation(msg, context, report=True)
    if "models" in msg.content:
        try:
            scored = _coalitions(msg, context)
            records[COALITIONS_RECORD] = MetricRecord(scored.as_record())
        except Exception as exc:  # contribution is an add-on: the evaluation stands regardless
            text = exc.args[0] if isinstance(exc, SiteDataError) and exc.args else None
            reason = sanitise(str(text) if text else f"{type(exc).__name__}: {exc}")
            records[COALITION_ERROR_RECORD] = ConfigRecord({"error": reason})
    return _reply(msg, metrics=MetricRecord(evaluation.as_record()), **records)


def _evaluation(msg: Message, context: Context, *, report: bool = False, bytes_received=None):
    """Score ``msg``'s ``arrays`` on the held-out split: the ``EvaluateReply`` (``bytes_received``:
    the model's protobuf size unless given) and, with ``report`` and config ``final``, the
    records to reply beside it (``report``: ``metrics.site_report``'s aggregates)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    config = msg.content["config"]
    cfg, fitted, data = _prepared(context, config, "test")
    if cfg.spec.model_kind == "xgboost":  # the booster's bytes (frp_flwr.trees)
        raw = trees.booster_bytes(msg.content["arrays"])
        xgb_params = _trees_params(cfg, fitted, config)
        loss, acc = trees.loss_and_accuracy(raw, data.X, data.y, xgb_params)
        proba = lambda X: trees.predict_proba(raw, X, xgb_params)  # noqa: E731
        pred = lambda X: trees.predict(raw, X, xgb_params)  # noqa: E731
    else:
        model = model_for(cfg.spec.model)
        params = msg.content["arrays"].to_numpy_ndarrays()
        loss, acc = loss_and_accuracy(model, params, data.X, data.y, task=fitted.task)
        proba = lambda X: predict_proba(model, params, X)  # noqa: E731
        pred = lambda X: predict(model, params, X)  # noqa: E731
    records = {}
    if report and bool(config.get("final", False)):
        if fitted.task == "classification":
            site = site_report(
                "classification",
                y=data.y,
                proba=proba(data.X),
                num_classes=len(fitted.classes),
            )
        else:
            scale, shift = fitted.target_std, fitted.target_mean
            site = site_report(
                "regression",
                y=data.y * scale + shift,
                pred=pred(data.X) * scale + shift,
                baseline_mean=shift,
            )
        records["report"] = ConfigRecord(json_record(site))
    if bytes_received is None:
        bytes_received = payload_bytes(RecordDict({"arrays": msg.content["arrays"]}))
    metrics = EvaluateReply(
        num_examples=len(data.y),
        eval_loss=loss,
        eval_accuracy=acc,
        bytes_received=bytes_received,
        bytes_sent=0,
        cpu_seconds=time.process_time() - cpu0,
        wall_seconds=time.perf_counter() - wall0,
    )
    if report:
        return metrics, records
    return metrics


@app.evaluate("coalitions")
@_guard
def evaluate_coalitions(msg: Message, context: Context) -> Message:
    """Score K coalition models (ArrayRecord "models": each layer stacked on axis 0) locally.

    Replies ``coalition-accuracy`` and ``coalition-loss`` (lists of K floats, in the order of the
    config's ``coalition-keys``; for regression the loss is the mean squared error in
    standardised target units and the accuracy 0) and the held-out example count, plus metering.
    """
    return _reply(msg, metrics=MetricRecord(_coalitions(msg, context).as_record()))


def _coalitions(msg: Message, context: Context) -> CoalitionReply:
    """The ``CoalitionReply`` of ``msg``'s stacked ``models`` (:func:`evaluate_coalitions`)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    config = msg.content["config"]
    cfg, fitted, data = _prepared(context, config, "test")
    model = model_for(cfg.spec.model)
    models = unstack_models(msg.content["models"].to_numpy_ndarrays())
    keys = list(config["coalition-keys"])
    if len(keys) != len(models):
        raise SiteDataError(f"{len(models)} coalition models for {len(keys)} coalition keys")
    scores = [
        loss_and_accuracy(model, params, data.X, data.y, task=fitted.task) for params in models
    ]
    return CoalitionReply(
        num_examples=len(data.y),
        coalition_loss=[loss for loss, _ in scores],
        coalition_accuracy=[acc for _, acc in scores],
        bytes_received=payload_bytes(RecordDict({"models": msg.content["models"]})),
        bytes_sent=0,
        cpu_seconds=time.process_time() - cpu0,
        wall_seconds=time.perf_counter() - wall0,
    )

"""Differential privacy for a run: Flower's fixed-clipping wrappers and mod, fitted to this app's loop.

The ServerApp runs its own round loop (it pushes and pulls messages itself, ADR 0006) instead of
Flower's ``Strategy.start``, so it never calls ``configure_train``. What the wrappers' own
``configure_train`` would have done is done here:

- server-side (``DifferentialPrivacyServerSideFixedClipping``): remember the round's global
  arrays (``current_arrays``), from which each site's update is measured and clipped;
- client-side (``DifferentialPrivacyClientSideFixedClipping``): put the clipping norm in the
  config every site receives under Flower's key ``clipping_norm``, which ``fixedclipping_mod``
  (the ClientApp's :func:`clip_mod`) reads to clip the site's update before it leaves the site.

Both wrappers then add Gaussian noise of standard deviation ``σ·C/n`` to the aggregate
(``flwr.supercore.differential_privacy.compute_stdv``; McMahan et al. 2018, "Learning
Differentially Private Recurrent Language Models", arXiv:1710.06963). ``n`` is the number of
sites aggregated in the round (set per round: a site that drops changes it).

The sensitivity ``C/n`` of the average holds for an average with equal weights; FedAvg weighs by
examples, which would let one large site move the aggregate by more than ``C/n``. With dp on the
aggregation therefore uses equal weights (:func:`before_aggregate`), the user-level (site-level)
DP-FedAvg of McMahan et al. The ε the portal states comes from its accountant
(``federation.privacy``), not from here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.clientapp.mod import fixedclipping_mod
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideFixedClipping,
    Strategy,
)

from frp_flwr.contract import TRAIN_ERROR_RECORD, Privacy

#: The config key ``fixedclipping_mod`` reads (``flwr.supercore.differential_privacy``).
KEY_CLIPPING_NORM = "clipping_norm"

DP_WRAPPERS = (
    DifferentialPrivacyServerSideFixedClipping,
    DifferentialPrivacyClientSideFixedClipping,
)


def wrap(strategy: Strategy, privacy: Privacy) -> Strategy:
    """``strategy`` wrapped in Flower's fixed-clipping DP wrapper for ``privacy.dp``.

    ``dp == "off"``: ``strategy`` itself. ``"server"``: the server clips each site's update to
    ``privacy.clipping_norm``; ``"client"``: the sites clip (:func:`clip_mod`). Either adds noise
    ``σ·C/n`` to the aggregate. ``num_sampled_clients`` starts at 1 and is set per round by
    :func:`before_aggregate`, which also makes the training aggregate's weights equal.
    Raises ``ValueError`` (Flower's) for a negative noise multiplier or a clipping norm ≤ 0.
    """
    if not privacy.enabled:
        return strategy
    cls = (
        DifferentialPrivacyServerSideFixedClipping
        if privacy.dp == "server"
        else DifferentialPrivacyClientSideFixedClipping
    )
    return cls(strategy, privacy.noise_multiplier, privacy.clipping_norm, num_sampled_clients=1)


def round_config(strategy: Strategy, config: ConfigRecord) -> None:
    """Add to ``config`` (what every site receives with the model) what the client-side wrapper's
    ``configure_train`` would: Flower's ``clipping_norm`` key. Nothing for other strategies."""
    if isinstance(strategy, DifferentialPrivacyClientSideFixedClipping):
        config[KEY_CLIPPING_NORM] = float(strategy.clipping_norm)


def before_aggregate(
    strategy: Strategy, replies: Iterable[Message], arrays: ArrayRecord
) -> list[Message]:
    """Ready a round's train ``replies`` for a DP wrapper's ``aggregate_train``; returns them.

    Sets ``num_sampled_clients`` to the number of replies (the ``n`` of ``σ·C/n``), the
    server-side wrapper's ``current_arrays`` to the round's global ``arrays`` (what its
    ``configure_train`` would record), and the inner strategy's weighting metric
    (``weighted_by_key``, FedAvg's ``num-examples``) to 1.0 in every reply (equal weights; the
    sites' true counts were read before, from the parsed replies). Replies are returned
    unchanged for a strategy without DP. Evaluation stays weighted by examples.
    """
    replies = list(replies)
    if not isinstance(strategy, DP_WRAPPERS):
        return replies
    strategy.num_sampled_clients = max(1, len(replies))
    if isinstance(strategy, DifferentialPrivacyServerSideFixedClipping):
        strategy.current_arrays = arrays
    key = getattr(strategy.strategy, "weighted_by_key", None)
    start = arrays.to_numpy_ndarrays()
    for reply in replies:
        for record in reply.content.metric_records.values():
            if key in record:
                record[key] = 1.0
        if isinstance(strategy, DifferentialPrivacyServerSideFixedClipping):
            for name, record in list(reply.content.array_records.items()):
                layers = record.to_numpy_ndarrays()
                if _nudge_if_zero(layers, start):
                    reply.content[name] = ArrayRecord(layers)
    return replies


def _nudge_if_zero(layers: list[np.ndarray], start: list[np.ndarray]) -> bool:
    """Move one weight of ``layers`` by one ulp (≥ 1e-150) when they equal ``start`` exactly (a zero
    update): Flower's clipping divides by the update's norm (``clip_inputs_inplace``) and raises
    ``ZeroDivisionError`` on 0 (flwr 1.42). Returns whether it did."""
    if len(layers) != len(start) or any(
        a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(layers, start, strict=True)
    ):
        return False
    for i, layer in enumerate(layers):
        if layer.size and np.issubdtype(layer.dtype, np.floating):
            layer = np.array(layer, copy=True)
            flat = layer.reshape(-1)
            # one ulp, at least 1e-150 so that its square (in the norm) does not underflow to 0
            flat[0] = flat[0] + max(float(np.spacing(np.abs(flat[0]))), 1e-150)
            layers[i] = layer
            return True
    return False


def clip_mod(msg: Message, context, call_next) -> Message:
    """ClientApp mod: Flower's ``fixedclipping_mod`` when the message's config carries
    ``clipping_norm`` (a client-side DP job), else the handler alone (jobs without it). A reply
    equal to the model sent (a zero update) is moved by one ulp first (:func:`_nudge_if_zero`)."""
    configs = list(msg.content.config_records.values())
    if not any(KEY_CLIPPING_NORM in c for c in configs):
        return call_next(msg, context)
    sent = [record.to_numpy_ndarrays() for record in msg.content.array_records.values()]
    inner: list[Message] = []

    def handler(message: Message, ctx) -> Message:  # a zero update would divide by 0 in Flower
        reply = call_next(message, ctx)
        inner.append(reply)
        if reply.has_error() or len(sent) != 1:
            return reply
        for name, record in list(reply.content.array_records.items()):
            layers = record.to_numpy_ndarrays()
            if _nudge_if_zero(layers, sent[0]):
                reply.content[name] = ArrayRecord(layers)
        return reply

    out = fixedclipping_mod(msg, context, handler)
    if inner and not inner[0].has_error() and TRAIN_ERROR_RECORD in inner[0].content:
        # a fused round's training failed after its evaluation (ADR 0032): no update to clip, and
        # the evaluation and the reason go back as they are (Flower's mod wants weights)
        return inner[0]
    return out

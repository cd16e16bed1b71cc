"""The order in which the ServerApp hands the sites' replies to the job's strategy (issue 14).

Krum (Blanchard et al. 2017) keeps the update with the lowest score; with three sites and f = 0
each score is the distance to the nearest other update, so the closest pair always tie and
Flower's ``select_multikrum`` keeps whichever of the two comes first in the replies. FedMedian,
FedTrimmedAvg and the weighted sums of FedAvg/FedOpt are order-dependent in floating point too.
The replies therefore reach the strategy in one order fixed by the sites alone (their names, the
contribution's player order), never by the node ids the SuperNodes drew at registration nor by
the order the replies arrived in.

``server_app.run_job`` runs over the stand-in SuperLink of ``test_flwr_trust`` (each node answers
with the real ClientApp handlers on its own in-memory split): the same three sites under two
node-id draws, one of them also answering in reverse order, must give the same final model bit
for bit.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from flwr.app import ArrayRecord, MetricRecord

from frp_flwr import server_app
from frp_flwr.contract import JobSpec, SiteLimits
from frp_flwr.strategies import train_reply
from tests.federation.test_flwr_trust import (  # noqa: F401 — its autouse fixtures
    ROWS,
    Node,
    NodeGrid,
    Portal,
    _cfg,
    in_memory_sites,
    task_identity,
)

SITES = sorted(ROWS)


class ReversedGrid(NodeGrid):
    """The stand-in SuperLink answering a pull with the replies in reverse order (as if the
    last site had replied first)."""

    def pull_messages(self, ids):
        return list(reversed(super().pull_messages(ids)))


def _final_model(strategy: dict, node_ids: list[int], grid_class=NodeGrid) -> list[np.ndarray]:
    """The final model of a 2-round job of ``strategy`` whose sites (in name order) drew
    ``node_ids``."""
    cfg = _cfg(rounds=2)
    spec = replace(JobSpec.from_json(cfg.job_spec), strategy=strategy)
    cfg = replace(cfg, job_spec=spec.to_text())
    nodes = {n: Node(site) for n, site in zip(node_ids, SITES, strict=True)}
    portal = Portal({s: SiteLimits(rows=n, cores=1) for s, n in ROWS.items()})
    server_app.run_job(grid_class(nodes, cfg.to_flower()), cfg, portal)
    (finished,) = portal.of("finished")
    return [np.asarray(layer, dtype=np.float64) for layer in finished.model]


@pytest.mark.parametrize(
    "strategy",
    [
        {"name": "krum", "num_malicious_nodes": 0},
        {"name": "fedmedian"},
        {"name": "fedtrimmedavg", "beta": 0.2},
        {"name": "fedavg"},
        {"name": "fedadam", "eta_l": 0.1},
    ],
    ids=lambda s: s["name"],
)
def test_the_final_model_is_the_same_whatever_node_ids_the_sites_drew(strategy):
    in_name_order = _final_model(strategy, [101, 102, 103])
    reversed_ids = _final_model(strategy, [103, 102, 101])
    reversed_arrival = _final_model(strategy, [102, 103, 101], ReversedGrid)

    for a, b, c in zip(in_name_order, reversed_ids, reversed_arrival, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_parse_replies_gives_the_replies_in_the_sites_name_order():
    """Replies that arrived c, a, b from nodes whose ids sort b, c, a come back a, b, c."""
    node_site = {7: "hospital-c", 9: "hospital-a", 3: "hospital-b"}
    sent = ArrayRecord([np.zeros(2)])
    result = server_app.Exchange()
    sites_out: dict[str, dict] = {s: {} for s in node_site.values()}
    for node in (7, 9, 3):
        reply = train_reply([np.full(2, float(node))], 10, node=node)
        reply.content["metrics"] = MetricRecord(
            {
                "num-examples": 10,
                "train-loss": 0.5,
                "bytes-received": 100,
                "bytes-sent": 100,
                "cpu-seconds": 0.1,
                "wall-seconds": 0.1,
            }
        )
        result.replies[node] = reply

    parsed = server_app.parse_replies(
        result,
        message_type="train",
        sent=sent,
        node_site=node_site,
        sites_out=sites_out,
        reply_type=server_app.TrainReply,
    )

    assert all("error" not in e for e in sites_out.values()), sites_out
    assert [node_site[n] for n in parsed] == ["hospital-a", "hospital-b", "hospital-c"]

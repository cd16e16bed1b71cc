"""The credit statement names how its job was trained and credited (issue 14): the model and its
hyper-parameters, the strategy and its parameters, the ε spent at δ with differential privacy,
SecAgg+, and the contribution method with why — on its page, in its JSON export (stable keys
under "method") and in its text export (one "Label: text" line each). Expected texts are written
out by hand."""

from __future__ import annotations

import html
import json
import re

import pytest
from django.test import Client

from accounting.services.credit import credit_statement_draft, credit_statement_update
from tests.accounting.credit_world import add_site, build_credit_world, score
from tests.factories import SiteFactory

pytestmark = pytest.mark.django_db

DP = {"dp": "server", "noise_multiplier": 1.1, "clipping_norm": 1.0, "delta": 1e-5}
FEDPROX = {"name": "fedprox", "mu": 0.1}
FEDADAM = {
    "name": "fedadam",
    "eta": 0.01,
    "eta_l": 0.05,
    "tau": 1e-9,
    "beta_1": 0.9,
    "beta_2": 0.99,
}
EXACT_BASIS = (
    "exact Shapley value over the whole run, because each coalition's model could be rebuilt "
    "from the sites' logged updates and 3 sites (at most 8) let every coalition be scored"
)
SECAGG_BASIS = (
    "data volume (training examples, from the row counts as released), because individual "
    "updates were hidden by secure aggregation, so no coalition model could be rebuilt"
)


def _world(*, shares: dict | None = None, method: str = "exact", **job_fields):
    world = build_credit_world(**job_fields)
    for k, share in (shares or {}).items():
        score(world.job, world.sites[k], share, method=method)
    return world


def _get(world, suffix: str = "", who: str = "ada"):
    client = Client()
    client.force_login(world.users[who])
    return client.get(f"/accounting/credit/jobs/{world.job.pk}/{suffix}")


def _method_json(world) -> dict:
    return json.loads(_get(world, "credit.json").content)["method"]


def _method_text(world) -> dict[str, str]:
    """The text export's lines after the paragraph, as {label: text}."""
    body = _get(world, "credit.txt").content.decode()
    _paragraph, blank, rest = body.partition("\n\n")
    assert blank, "no blank line between the paragraph and the method lines"
    return dict(line.split(": ", 1) for line in rest.splitlines())


def _method_html(world) -> dict[str, str]:
    """The statement page's method card, as {data-method slug: text}."""
    page = _get(world).content.decode()
    card = re.search(r'id="credit-method".*?</dl>', page, re.S)
    assert card, "no method card on the statement page"
    return {
        k: html.unescape(v) for k, v in re.findall(r'data-method="([^"]+)">(.*?)</dd>', card[0])
    }


SHARES = {"A": 0.23, "B": 0.42, "C": 0.35}


# ---------------------------------------------------------------------------------------------
# FedAvg, no DP, no SecAgg+
# ---------------------------------------------------------------------------------------------


def test_fedavg_job_json_names_model_strategy_and_no_privacy():
    world = _world(shares=SHARES)

    method = _method_json(world)

    assert method["model"] == {
        "kind": "linear",
        "params": {},
        "description": "logistic (softmax) regression",
    }
    assert method["strategy"] == {"name": "fedavg", "params": {}, "description": "FedAvg"}
    assert method["privacy"] is None
    assert method["secure_aggregation"] is False
    assert method["contribution"] == {
        "method": "exact",
        "measured": True,
        "reason": "all_coalitions",
        "description": EXACT_BASIS,
    }


def test_fedavg_job_text_and_page_lines():
    world = _world(shares=SHARES)
    expected = {
        "Model": "logistic (softmax) regression",
        "Strategy": "FedAvg",
        "Training": "5 rounds, 5 local epochs, site learning rate 0.1",
        "Differential privacy": "off",
        "Secure aggregation": "off",
        "Contribution method": EXACT_BASIS,
    }

    assert _method_text(world) == expected
    assert _method_html(world) == {
        "model": expected["Model"],
        "strategy": expected["Strategy"],
        "training": expected["Training"],
        "differential-privacy": "off",
        "secure-aggregation": "off",
        "contribution-method": EXACT_BASIS,
    }


# ---------------------------------------------------------------------------------------------
# Strategies with parameters, models with hyper-parameters
# ---------------------------------------------------------------------------------------------


def test_fedprox_job_names_mu_in_json_text_and_page():
    world = _world(shares=SHARES, strategy="fedprox", strategy_spec=FEDPROX)

    assert _method_json(world)["strategy"] == {
        "name": "fedprox",
        "params": {"mu": 0.1},
        "description": "FedProx (μ = 0.1)",
    }
    assert _method_text(world)["Strategy"] == "FedProx (μ = 0.1)"
    assert _method_html(world)["strategy"] == "FedProx (μ = 0.1)"


def test_fedadam_job_names_server_rate_and_tau_and_sites_train_at_eta_l():
    world = _world(strategy="fedadam", strategy_spec=FEDADAM)
    described = (
        "FedAdam (server learning rate 0.01, site learning rate 0.05, τ = 1e-9, β₁ = 0.9, "
        "β₂ = 0.99)"
    )

    method = _method_json(world)

    assert method["strategy"]["params"] == {k: v for k, v in FEDADAM.items() if k != "name"}
    assert method["strategy"]["description"] == described
    assert method["training"]["learning_rate"] == 0.05
    assert _method_text(world)["Training"] == "5 rounds, 5 local epochs, site learning rate 0.05"


def test_mlp_job_gives_kind_and_hyper_parameters():
    spec = {"kind": "mlp", "hidden": [16, 8], "activation": "tanh", "dropout": 0.1, "l2": 1e-4}
    world = _world(model="mlp", model_spec=spec)

    model = _method_json(world)["model"]

    assert model["kind"] == "mlp"
    assert model["params"] == {"hidden": [16, 8], "activation": "tanh", "dropout": 0.1, "l2": 1e-4}
    assert model["description"] == (
        "multilayer perceptron (hidden 16×8, tanh, dropout 0.1, L2 0.0001)"
    )


def test_trees_job_is_bagged_and_credited_by_data_volume_planned():
    world = _world(model="xgboost", model_spec={"kind": "xgboost"})

    method = _method_json(world)

    assert method["strategy"]["name"] == "fedxgbbagging" and method["strategy"]["params"] == {}
    assert method["training"]["local_epochs"] is None
    assert method["training"]["learning_rate"] is None
    assert method["contribution"]["method"] == "data_volume"
    assert method["contribution"]["reason"] == "tree_bagging"
    assert method["contribution"]["measured"] is False
    assert method["contribution"]["description"].endswith("(not measured yet)")


# ---------------------------------------------------------------------------------------------
# Differential privacy
# ---------------------------------------------------------------------------------------------


def test_dp_job_json_gives_epsilon_delta_and_mode():
    world = _world(shares=SHARES, privacy=DP, epsilon=2.9134)

    assert _method_json(world)["privacy"] == {
        "mode": "server",
        "epsilon": 2.9134,
        "delta": 1e-5,
        "noise_multiplier": 1.1,
        "clipping_norm": 1.0,
        "description": "ε = 2.91 at δ = 1e-5, server-side fixed clipping",
    }


def test_dp_job_text_and_page_state_epsilon_at_delta():
    world = _world(shares=SHARES, privacy=DP, epsilon=2.9134)
    expected = "ε = 2.91 at δ = 1e-5, server-side fixed clipping"

    assert _method_text(world)["Differential privacy"] == expected
    assert _method_html(world)["differential-privacy"] == expected


def test_client_side_dp_is_named_so():
    world = _world(privacy=DP | {"dp": "client", "delta": 1e-6}, epsilon=0.51234)

    privacy = _method_json(world)["privacy"]

    assert privacy["mode"] == "client"
    assert privacy["description"] == "ε = 0.512 at δ = 1e-6, client-side fixed clipping"


def test_job_page_states_epsilon_in_the_statements_words():
    world = _world(privacy=DP, epsilon=2.9134)
    client = Client()
    client.force_login(world.users["ada"])

    page = html.unescape(client.get(f"/jobs/{world.job.pk}/").content.decode())

    dd = re.search(r'id="job-epsilon"[^>]*>(.*?)</dd>', page)
    assert dd and dd[1] == "ε = 2.91 at δ = 1e-5"
    assert "Server-side fixed clipping" in page
    assert dd[1] in _method_text(world)["Differential privacy"]


# ---------------------------------------------------------------------------------------------
# Secure aggregation
# ---------------------------------------------------------------------------------------------


def test_secagg_job_json_text_and_page_say_secagg_and_data_volume():
    world = _world(
        shares=SHARES,
        method="data_volume",
        secure_aggregation=True,
        final_metrics={"updates_hidden": True},
    )

    method = _method_json(world)
    text = _method_text(world)
    page = _method_html(world)

    assert method["secure_aggregation"] is True and method["privacy"] is None
    assert method["contribution"] == {
        "method": "data_volume",
        "measured": True,
        "reason": "secure_aggregation",
        "description": SECAGG_BASIS,
    }
    assert text["Secure aggregation"] == "SecAgg+" == page["secure-aggregation"]
    assert text["Contribution method"] == SECAGG_BASIS == page["contribution-method"]


def test_secagg_job_not_run_yet_plans_data_volume():
    world = _world(secure_aggregation=True)

    contribution = _method_json(world)["contribution"]

    assert contribution["method"] == "data_volume" and contribution["measured"] is False
    assert contribution["description"] == SECAGG_BASIS + " (not measured yet)"


def test_many_sites_not_measured_yet_plan_gtg_shapley():
    world = _world()
    for _ in range(6):  # 3 + 6 = 9 sites, one more than exact Shapley enumerates
        add_site(world.job, SiteFactory())

    contribution = _method_json(world)["contribution"]

    assert contribution["method"] == "gtg" and contribution["reason"] == "many_sites"
    assert "9 sites (more than 8)" in contribution["description"]


# ---------------------------------------------------------------------------------------------
# Preview, draft and edited statement say the same
# ---------------------------------------------------------------------------------------------


def test_preview_draft_and_edited_statement_give_the_same_method():
    world = _world(shares=SHARES, strategy="fedprox", strategy_spec=FEDPROX)
    preview = _method_json(world)
    statement = credit_statement_draft(job=world.job)
    draft = _method_json(world)
    rows = [
        {"id": c.pk, "name": c.name, "kind": c.kind, "roles": c.roles, "share": c.share}
        for c in statement.contributors.order_by("position")
    ]
    credit_statement_update(by=world.users["grace"], statement=statement, contributors=rows[:-1])

    edited = _method_json(world)

    assert preview == draft == edited
    assert edited["strategy"]["params"] == {"mu": 0.1}

"""Integration: every server-side strategy the job form offers, and client-side differential
privacy, through the web form on a real Flower deployment (issue 14, points 2 and 3).

Three hospitals hold scikit-learn's breast-cancer data (569 rows, 30 numeric features, a 0/1
diagnosis), dealt IID. The researcher submits six jobs through the job form (Django test client, as
a browser posts it), all at once as researchers do, and the portal's scheduler admits them onto the
sites' pools: FedAdam with client-side fixed clipping (Flower's
``DifferentialPrivacyClientSideFixedClipping`` and the sites' clipping mod), FedYogi, FedAdagrad,
FedMedian, FedTrimmedAvg and Krum, one round each. Real parts: PostgreSQL, a Celery worker with
beat on Redis, a SuperLink and three SuperNodes, the live server's callback endpoint.

Checked for each job: it completed; the run config every site receives names the strategy and its
parameters as the form set them; the pooled held-out accuracy is finite and above the held-out
majority-class rate (computed here from the sites' decrypted tables with the app's split rule, not
from the portal's figures); the job page names the strategy. For the DP job: the ε on the job page
equals the accountant's (``federation.privacy.epsilon``, dp-accounting) for its noise and rounds,
and the page says the clipping was client-side.

The strategies' arithmetic against Flower's own classes is in ``test_flwr_strategies.py``; this
module proves the whole path from the form to a completed job for each of them.
"""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest
from django.test import Client

from federation import services
from federation.models import ComputePool, FederatedJob, JobStatus
from federation.privacy import epsilon as accountant_epsilon
from frp_flwr import contract
from tests.federation.conftest import flower_world, wait_for
from tests.federation.job_form import job_form_data, site_frames
from tests.federation.test_models_integration import SITES, _write_sites

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: One round: it takes each strategy's aggregate (and the DP job's noise) from the form to the final
#: model; the arithmetic of later rounds (server momentum, DP over rounds) is test_flwr_strategies'
#: and the accountant's. Each round costs every site a ClientApp process per job.
ROUNDS = 1
NOISE, CLIP, DELTA = 0.2, 1.0, 1e-5

#: title → (form fields, the strategy spec the sites must receive, the label on the job page).
JOBS = {
    "FedAdam with client-side DP": (
        {
            "strategy_name": "fedadam",
            "server_eta": "0.1",
            "server_tau": "0.001",
            "privacy-dp": "client",
            "privacy-noise_multiplier": str(NOISE),
            "privacy-clipping_norm": str(CLIP),
            "privacy-delta": str(DELTA),
        },
        {"name": "fedadam", "eta": 0.1, "tau": 0.001},
        "FedAdam",
    ),
    "FedYogi": (
        {"strategy_name": "fedyogi", "server_eta": "0.05"},
        {"name": "fedyogi", "eta": 0.05},
        "FedYogi",
    ),
    "FedAdagrad": ({"strategy_name": "fedadagrad"}, {"name": "fedadagrad"}, "FedAdagrad"),
    "FedMedian": ({"strategy_name": "fedmedian"}, {"name": "fedmedian"}, "FedMedian"),
    "FedTrimmedAvg": (
        {"strategy_name": "fedtrimmedavg", "trimmed_beta": "0.2"},
        {"name": "fedtrimmedavg", "beta": 0.2},
        "FedTrimmedAvg",
    ),
    "Krum": ({"strategy_name": "krum", "krum_faulty": "0"}, {"name": "krum"}, "Krum"),
}


@pytest.fixture(scope="module")
def strategies_world(django_db_setup, django_db_blocker, live_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("flower-strategies")
    with flower_world(
        SITES,
        root=root,
        live_server=live_server,
        django_db_blocker=django_db_blocker,
        csvs=_write_sites(root / "incoming"),
        env={"FRP_ROUND_TIMEOUT": "400"},  # a loaded 2-core machine starts ClientApps slowly
    ) as world:
        yield world


def _held_out_majority(w, job) -> float:
    """The share of the most frequent label among the pooled held-out rows (the app's split)."""
    spec = contract.JobSpec(
        sites={js.site.slug: contract.SitePointer("k", "d", 1) for js in job.sites.all()},
        target=job.target_column,
        features=list(job.feature_columns),
    )
    labels: list[str] = []
    for _site, frame in site_frames(w, job, spec):
        labels.extend(np.asarray(frame.y)[frame.test].astype(str).tolist())
    return Counter(labels).most_common(1)[0][1] / len(labels)


@pytest.fixture(scope="module")
def outcome(strategies_world, django_db_blocker):
    w = strategies_world
    with django_db_blocker.unblock():
        # Three jobs at a time on every site's pool (the world's pools take one): the six run in
        # two waves instead of six, the scheduler still admitting each wave as a gang
        ComputePool.objects.filter(site__in=[v.dataset.site for v in w.versions]).update(slots=3)
        client = Client()
        client.force_login(w.researcher)
        versions = [str(v.pk) for v in w.versions]
        pks = {}
        for title, (fields, _, _) in JOBS.items():
            _, data = job_form_data(
                client,
                datasets=versions,
                target="diagnosis",
                title=title,
                num_rounds=ROUNDS,
                local_epochs=3,
                learning_rate=0.1,
                **fields,
            )
            response = client.post("/jobs/new/", data)
            assert response.status_code == 302, (title, response.content.decode()[-3000:])
            pks[title] = FederatedJob.objects.get(title=title).pk

        def all_finished():
            jobs = list(FederatedJob.objects.filter(pk__in=pks.values()))
            return jobs if all(j.is_terminal for j in jobs) else None

        wait_for(all_finished, timeout=1800, what="the six strategy jobs to finish")
        results = {}
        for title, pk in pks.items():
            job = FederatedJob.objects.get(pk=pk)
            results[title] = {
                "job": job,
                "site_errors": {
                    js.site.slug: js.last_error for js in job.sites.select_related("site")
                },
                "sent_spec": contract.JobSpec.from_json(services.job_run_config(job).job_spec),
                "job_page": client.get(f"/jobs/{job.pk}/").content.decode(),
                "majority": _held_out_majority(w, job),
            }
        return results


@pytest.mark.parametrize("title", list(JOBS))
def test_each_strategy_completes_above_the_majority_class_and_is_named(outcome, title):
    result = outcome[title]
    job = result["job"]
    _, expected_strategy, label = JOBS[title]
    assert job.status == JobStatus.COMPLETED, (job.status_detail, result["site_errors"])
    # The run config every SuperNode receives carries the strategy and its parameters.
    sent = result["sent_spec"].strategy
    assert {k: sent.get(k) for k in expected_strategy} == expected_strategy
    accuracy = job.final_metrics["metrics"]["accuracy"]
    print(f"\n{title}: accuracy {accuracy:.4f}, held-out majority {result['majority']:.4f}")
    assert math.isfinite(accuracy)
    assert accuracy > result["majority"]
    shown = re.search(r'id="job-strategy">([^<]*)<', result["job_page"]).group(1)
    assert shown.startswith(label), shown


def test_client_side_dp_spends_the_accountants_epsilon(outcome):
    result = outcome["FedAdam with client-side DP"]
    job = result["job"]
    expected = accountant_epsilon(noise_multiplier=NOISE, rounds=ROUNDS, delta=DELTA)
    assert job.privacy["dp"] == "client"
    assert result["sent_spec"].privacy.dp == "client"
    assert result["sent_spec"].privacy.clipping_norm == CLIP
    assert job.epsilon == pytest.approx(expected, rel=1e-9)
    page = result["job_page"]
    shown = float(re.search(r'id="job-epsilon" data-epsilon="([0-9.e+-]+)"', page).group(1))
    assert shown == pytest.approx(expected, rel=1e-9)
    assert re.search(r'id="job-dp">Client-side fixed clipping<', page)
    # The jobs without DP spent nothing.
    others = [r["job"] for t, r in outcome.items() if t != "FedAdam with client-side DP"]
    assert all(j.epsilon is None for j in others)

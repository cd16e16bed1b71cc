"""Differential privacy in the portal (ADR 0025): the accountant against a closed form, the job
form's ε preview (HTMX partial and the no-JavaScript button), the steward's ε budget and the
refusal at submission with the figures, the job page and the ledger leaf.

The SuperLink boundary is faked (``FakeSuperLink``); the real run is in
``test_privacy_integration.py``.
"""

# ruff: noqa: F811 — the fixtures shared with test_views are imported by name
from __future__ import annotations

import html
import json
import math
import re

import pytest
from scipy.optimize import brentq
from scipy.stats import norm

from federation import privacy, services
from federation.models import FederatedJob, JobStatus, RoundMetric
from frp_flwr import contract
from portal.ledger.models import LedgerEntry
from portal.models import Membership, Role
from sandbox import services as sandbox_services
from sandbox.models import AccessRequest, AccessStatus, PrivacyBudget
from tests.factories import UserFactory
from tests.federation.test_views import _form_data, fake_superlink, pi_client, world  # noqa: F401

pytestmark = pytest.mark.django_db

DP = {"privacy-dp": "server", "privacy-noise_multiplier": 1.0, "privacy-clipping_norm": 1.0,
      "privacy-delta": 1e-5}  # fmt: skip


def gaussian_epsilon(noise: float, rounds: int, delta: float) -> float:
    """The exact ε of ``rounds`` Gaussian mechanisms of noise multiplier ``noise`` at ``delta``:
    their composition is one Gaussian mechanism with μ = √rounds / noise, whose privacy profile is
    δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Balle & Wang 2018, "Improving the Gaussian
    Mechanism for Differential Privacy", Theorem 8; Dong, Roth & Su 2022, Corollary 2.13)."""
    mu = math.sqrt(rounds) / noise
    return brentq(
        lambda e: norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2) - delta,
        0.0,
        100.0,
        xtol=1e-12,
    )


# --- the accountant ---------------------------------------------------------------------------


@pytest.mark.parametrize("noise, rounds", [(1.0, 10), (2.0, 5), (5.0, 50), (0.8, 3)])
def test_accountant_matches_the_gaussian_mechanisms_closed_form(noise, rounds):
    exact = gaussian_epsilon(noise, rounds, 1e-5)
    assert privacy.epsilon(noise_multiplier=noise, rounds=rounds, delta=1e-5) == pytest.approx(
        exact, rel=1e-6
    )
    # RDP is an upper bound, and a looser one
    rdp = privacy.epsilon(noise_multiplier=noise, rounds=rounds, delta=1e-5, accountant="rdp")
    assert rdp > exact * 1.01


def test_accountant_subsampling_lowers_epsilon_and_more_rounds_raise_it():
    full = privacy.epsilon(noise_multiplier=1.0, rounds=10, delta=1e-5)
    assert privacy.epsilon(noise_multiplier=1.0, rounds=10, delta=1e-5, sampling_rate=0.3) < full
    assert privacy.epsilon(noise_multiplier=1.0, rounds=20, delta=1e-5) > full


@pytest.mark.parametrize("noise, rounds", [(0.01, 100), (0.01, 1), (0.3, 100)])
def test_accountant_small_noise_over_many_rounds_is_exact_and_immediate(noise, rounds):
    """The form allows σ down to 0.01 and 100 rounds: the PLD grid for these took minutes and
    gigabytes (σ = 0.01, 100 rounds: ``MemoryError``, a 500 on the ε preview). With every site
    in every round the composition is one Gaussian mechanism of σ/√R, computed exactly."""
    mu = math.sqrt(rounds) / noise
    got = privacy.epsilon(noise_multiplier=noise, rounds=rounds, delta=1e-5)
    # δ(ε) of the Gaussian mechanism at the returned ε is the asked δ (log space: ε is huge)
    log_delta = norm.logcdf(-got / mu + mu / 2) + math.log1p(
        -math.exp(got + norm.logcdf(-got / mu - mu / 2) - norm.logcdf(-got / mu + mu / 2))
    )
    assert log_delta == pytest.approx(math.log(1e-5), abs=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"noise_multiplier": 0.0},
        {"noise_multiplier": math.inf},
        {"rounds": 0},
        {"delta": 1.0},
        {"sampling_rate": 0.0},
        {"accountant": "moments"},
    ],
)
def test_accountant_refuses_settings_out_of_range(kwargs):
    args = {"noise_multiplier": 1.0, "rounds": 3, "delta": 1e-5, **kwargs}
    with pytest.raises(privacy.PrivacyError):
        privacy.epsilon(**args)


# --- submission: ε stored, ledger, budget refusal ---------------------------------------------


def _budget(world, dataset, epsilon):
    return PrivacyBudget.objects.create(project=world["project"], dataset=dataset, epsilon=epsilon)


def _submit(world, rounds=3, secure_aggregation=False, **privacy_):
    return services.job_submit(
        secure_aggregation=secure_aggregation,
        by=world["pi"],
        project=world["project"],
        dataset_versions=world["versions"],
        title="dp",
        target_column="label",
        num_rounds=rounds,
        privacy={"dp": "server", "noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 1e-5}
        | privacy_,
    )


def test_submit_with_dp_stores_epsilon_and_a_ledger_leaf_of_figures(world, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    job = _submit(world, rounds=4)
    expected = gaussian_epsilon(1.0, 4, 1e-5)
    assert job.epsilon == pytest.approx(expected, rel=1e-6)
    assert job.privacy == {"dp": "server", "noise_multiplier": 1.0, "clipping_norm": 1.0,
                           "delta": 1e-5}  # fmt: skip
    leaf = json.loads(LedgerEntry.objects.get(kind="privacy").data)
    assert leaf["job"] == job.pk and float(leaf["epsilon"]) == job.epsilon
    assert leaf["rounds"] == 4 and float(leaf["delta"]) == 1e-5
    spec = json.loads(services.job_run_config(job).job_spec)
    assert spec["privacy"]["dp"] == "server" and spec["privacy"]["clipping_norm"] == 1.0


def test_submit_without_dp_has_no_epsilon_and_no_privacy_leaf(world, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    job = services.job_submit(
        by=world["pi"],
        project=world["project"],
        dataset_versions=world["versions"],
        title="plain",
        target_column="label",
        num_rounds=3,
    )
    assert job.epsilon is None and job.privacy == {}
    assert json.loads(services.job_run_config(job).job_spec)["privacy"]["dp"] == "off"
    assert not LedgerEntry.objects.filter(kind="privacy").exists()


def test_dp_with_gradient_boosted_trees_is_refused_on_the_dp_field(world, settings):
    """DP clips and noises weight updates; trees send trees: the two are not combined."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    with pytest.raises(services.JobError) as err:
        services.job_submit(
            by=world["pi"],
            project=world["project"],
            dataset_versions=world["versions"],
            title="trees with dp",
            target_column="label",
            num_rounds=3,
            model={"kind": "xgboost"},
            privacy={"dp": "server", "noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 1e-5},
        )
    assert "cannot protect them" in err.value.field_errors["dp"][0]
    assert FederatedJob.objects.count() == 0


def test_dp_with_secure_aggregation_is_refused_on_the_dp_field_and_by_the_contract(world, settings):
    """Flower's clipping needs each site's update; SecAgg+ leaves the server only the sum."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    with pytest.raises(services.JobError) as err:
        _submit(world, secure_aggregation=True)
    assert "Choose one of the two" in err.value.field_errors["dp"][0]
    assert FederatedJob.objects.count() == 0
    dp = {"dp": "client", "noise_multiplier": 1.0, "clipping_norm": 1.0, "delta": 1e-5}
    with pytest.raises(contract.ContractError, match="cannot be combined with secure aggregation"):
        contract.Privacy.from_json({**dp, "secagg": True})


def test_submit_over_a_budget_is_refused_with_spent_this_job_and_budget(world, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    one = gaussian_epsilon(1.0, 3, 1e-5)
    _budget(world, world["versions"][1].dataset, epsilon=1.5 * one)
    first = _submit(world)  # within: spent 0 + one ≤ 1.5·one
    RoundMetric.objects.create(job=first, round=1)
    with pytest.raises(services.JobError) as err:
        _submit(world)
    (message,) = err.value.field_errors["dp"]
    title = world["versions"][1].dataset.title
    assert title in message
    assert f"spent {one:.3g}, this job {one:.3g}, budget {1.5 * one:.3g}" in message
    assert FederatedJob.objects.count() == 1


def test_a_job_without_dp_on_a_dataset_with_a_budget_is_refused_with_the_budget(world, settings):
    """Without differential privacy a job's ε is unbounded: it would take any budget, so a
    steward's budget on a chosen dataset requires dp on."""
    settings.CELERY_TASK_ALWAYS_EAGER = False
    _budget(world, world["versions"][1].dataset, epsilon=2.0)
    with pytest.raises(services.JobError) as err:
        services.job_submit(
            by=world["pi"],
            project=world["project"],
            dataset_versions=world["versions"],
            title="no dp",
            target_column="label",
            num_rounds=3,
            privacy={"dp": "off"},
        )
    (message,) = err.value.field_errors["dp"]
    assert world["versions"][1].dataset.title in message
    assert "budget 2" in message and "differential privacy" in message
    assert FederatedJob.objects.count() == 0


def test_a_job_that_ended_without_a_round_spent_nothing(world, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    one = gaussian_epsilon(1.0, 3, 1e-5)
    _budget(world, world["versions"][0].dataset, epsilon=1.5 * one)
    first = _submit(world)
    FederatedJob.objects.filter(pk=first.pk).update(status=JobStatus.FAILED)
    assert _submit(world).epsilon == pytest.approx(one)  # the failed job released nothing


def test_budgets_are_per_project(world, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    from tests.factories import ProjectFactory

    other = ProjectFactory()
    PrivacyBudget.objects.create(project=other, dataset=world["versions"][0].dataset, epsilon=0.01)
    assert _submit(world).epsilon is not None


@pytest.mark.parametrize(
    "change, error",
    [({"noise_multiplier": 0.0}, "noise_multiplier"), ({"dp": "local"}, "is not one of")],
)
def test_submit_with_bad_privacy_is_a_job_error(world, change, error):
    with pytest.raises(services.JobError) as err:
        _submit(world, **change)
    assert error in err.value.field_errors["dp"][0]


# --- the job form -----------------------------------------------------------------------------


def _text(response) -> str:
    return html.unescape(response.content.decode())


def test_form_preview_partial_shows_the_accountants_epsilon(pi_client, world):
    response = pi_client.post("/jobs/new/privacy/", _form_data(world, num_rounds=4) | DP)
    assert response.status_code == 200
    shown = float(re.search(r'data-epsilon="([0-9.e+-]+)"', response.content.decode()).group(1))
    assert shown == pytest.approx(gaussian_epsilon(1.0, 4, 1e-5), rel=1e-6)
    assert "4 rounds, 2 sites each round" in _text(response)


def test_form_preview_with_the_smallest_noise_and_most_rounds_answers(pi_client, world):
    data = _form_data(world, num_rounds=100) | DP | {"privacy-noise_multiplier": "0.01"}
    response = pi_client.post("/jobs/new/privacy/", data)
    assert response.status_code == 200
    shown = float(re.search(r'data-epsilon="([0-9.e+-]+)"', response.content.decode()).group(1))
    assert shown > 1e5  # no privacy to speak of, and said so


def test_form_preview_shows_the_budget_figures(pi_client, world):
    _budget(world, world["versions"][0].dataset, epsilon=0.5)
    response = pi_client.post("/jobs/new/privacy/", _form_data(world) | DP)
    page = _text(response)
    assert "Cohort Alpha" in page and "exceeded" in page and "0.500" in page


def test_form_preview_without_javascript_renders_the_form_with_epsilon(pi_client, world):
    data = _form_data(world, num_rounds=2) | DP | {"privacy_preview": "1"}
    response = pi_client.post("/jobs/new/", data)
    assert response.status_code == 200 and not FederatedJob.objects.exists()
    assert "Submit a federated job" in _text(response)
    shown = float(re.search(r'data-epsilon="([0-9.e+-]+)"', response.content.decode()).group(1))
    assert shown == pytest.approx(gaussian_epsilon(1.0, 2, 1e-5), rel=1e-6)


def test_form_preview_with_dp_off_says_infinite(pi_client, world):
    response = pi_client.post("/jobs/new/privacy/", _form_data(world) | {"privacy-dp": "off"})
    assert "ε = ∞" in _text(response)


def test_form_dp_on_without_noise_shows_the_error_inline(pi_client, world):
    data = _form_data(world) | DP | {"privacy-noise_multiplier": ""}
    response = pi_client.post("/jobs/new/", data)
    assert response.status_code == 200 and not FederatedJob.objects.exists()
    page = _text(response)
    block = page[page.index('for="id_privacy-noise_multiplier"') :][:1500]
    assert "Required with differential privacy on." in block


def test_form_over_budget_refusal_is_inline_with_the_figures(
    pi_client,
    world,
    fake_superlink,
):
    _budget(world, world["versions"][0].dataset, epsilon=1.0)
    response = pi_client.post("/jobs/new/", _form_data(world) | DP)
    assert response.status_code == 200 and not FederatedJob.objects.exists()
    page = _text(response)
    error = re.search(r'id="privacy-dp-error">([^<]*)<', page).group(1)
    eps = gaussian_epsilon(1.0, 3, 1e-5)
    assert f"spent 0, this job {eps:.3g}, budget 1" in error


def test_form_valid_dp_post_creates_the_job_and_its_page_shows_epsilon(
    pi_client,
    world,
    fake_superlink,
    eager_celery,
    django_capture_on_commit_callbacks,
):
    with django_capture_on_commit_callbacks(execute=True):
        response = pi_client.post("/jobs/new/", _form_data(world) | DP)
    job = FederatedJob.objects.get()
    assert response.status_code == 302 and job.epsilon is not None
    spec = json.loads(fake_superlink.submitted[0]["job-spec"])
    assert {k: spec["privacy"][k] for k in job.privacy} == job.privacy
    assert spec["privacy"]["secagg"] is False
    page = pi_client.get(f"/jobs/{job.pk}/").content.decode()
    shown = float(re.search(r'id="job-epsilon" data-epsilon="([0-9.e+-]+)"', page).group(1))
    assert shown == job.epsilon
    assert "Server-side fixed clipping" in page


# --- the steward's budget ---------------------------------------------------------------------


@pytest.fixture
def steward(world):
    dataset = world["versions"][0].dataset
    user = UserFactory()
    Membership.objects.create(
        user=user, institution=dataset.site.institution, role=Role.DATA_STEWARD
    )
    return user


def _grant(world):
    return AccessRequest.objects.get(
        project=world["project"], dataset=world["versions"][0].dataset, status=AccessStatus.APPROVED
    )


def test_steward_sets_a_budget_on_the_queue_page(client, world, steward):
    client.force_login(steward)
    grant = _grant(world)
    response = client.post(f"/access-requests/{grant.pk}/privacy-budget/", {"epsilon": "2.5"})
    assert response.status_code == 302
    assert PrivacyBudget.objects.get(project=world["project"]).epsilon == 2.5
    leaf = json.loads(LedgerEntry.objects.get(kind="privacy_budget").data)
    assert leaf["epsilon"] == "2.5" and leaf["dataset"] == grant.dataset_id
    page = client.get("/access-requests/?status=approved").content.decode()
    assert 'value="2.5"' in page


def test_steward_budget_out_of_range_is_refused(client, world, steward):
    client.force_login(steward)
    grant = _grant(world)
    response = client.post(
        f"/access-requests/{grant.pk}/privacy-budget/", {"epsilon": "-1"}, follow=True
    )
    assert "ε budget" in _text(response) and not PrivacyBudget.objects.exists()


def test_another_institutions_steward_cannot_set_a_budget(world):
    outsider = UserFactory()
    with pytest.raises(sandbox_services.AccessError):
        sandbox_services.privacy_budget_set(by=outsider, request_id=_grant(world).pk, epsilon=1.0)

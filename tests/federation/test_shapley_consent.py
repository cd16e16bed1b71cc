"""Shapley values only with every data steward's opt-in (issue 9, F1; ADR 0036).

The closing evaluation of a Shapley job sends every site the model of every coalition, the one
trained on a single site's data included, so each site can recover the others' updates. A steward
opts a dataset in on its page (audited, ledgered); a job whose datasets are not all opted in runs
without coalition models (``contribution`` false in the run config, recorded on the job at
launch) and credits every site by data volume, and its pages say why. The real Flower run of the
same path is in ``test_integration.py`` (``test_opted_out_job_sends_no_coalition_model``).
"""

from __future__ import annotations

import pytest

from accounting.models import ContributionMethod
from accounting.selectors.contribution import VOLUME_REASONS, volume_basis
from accounting.selectors.credit import contribution_basis
from accounting.services.contribution import contribution_score_job
from federation import services
from federation.selectors import shapley_not_opted_in
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent, Role
from sandbox import services as sandbox_services
from sandbox.models import Dataset
from tests.factories import MembershipFactory, UserFactory
from tests.federation import test_services
from tests.federation.callback_support import record_one_round

world, fake_superlink, launch = (
    test_services.world,
    test_services.fake_superlink,
    test_services.launch,
)
submit = test_services.submit

pytestmark = pytest.mark.django_db


def _opt_out(version) -> None:
    Dataset.objects.filter(pk=version.dataset_id).update(shapley_opt_in=False)


def _steward(dataset):
    user = UserFactory()
    MembershipFactory(user=user, institution=dataset.site.institution, role=Role.DATA_STEWARD)
    return user


def test_a_new_dataset_is_not_opted_in():
    """The product's default (the test factories opt in explicitly)."""
    assert Dataset._meta.get_field("shapley_opt_in").default is False


def test_run_config_asks_for_coalition_models_only_when_every_steward_opted_in(world):
    job = submit(world)
    assert services.job_run_config(job).contribution is True
    _opt_out(world["versions"][1])
    assert shapley_not_opted_in(job=job) == [world["versions"][1].dataset.site.slug]
    assert services.job_run_config(job).contribution is False
    assert services.job_run_config(job).to_flower()["contribution"] is False


def test_launch_records_the_consent_it_ran_under(world, fake_superlink, launch):
    _opt_out(world["versions"][0])
    job = launch(world)
    job.refresh_from_db()
    assert job.shapley_consent is False
    assert fake_superlink.submitted[0]["contribution"] is False
    # Opting in after the launch does not change what the run was told
    Dataset.objects.update(shapley_opt_in=True)
    assert services.job_run_config(job).contribution is False


def test_opted_in_launch_sends_contribution(client, world, fake_superlink, launch):
    job = launch(world)
    job.refresh_from_db()
    assert job.shapley_consent is True
    assert fake_superlink.submitted[0]["contribution"] is True
    # The page states the consent the run ran under, not today's settings
    Dataset.objects.update(shapley_opt_in=False)
    client.force_login(world["pi"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "had opted in when the job was launched; coalition models:" in page


def test_opted_out_job_is_credited_by_data_volume_and_its_pages_say_why(
    client, world, fake_superlink, launch
):
    _opt_out(world["versions"][1])
    job = launch(world)
    a, b = (v.dataset.site.slug for v in world["versions"])
    record_one_round(job, {a: 60, b: 20})
    job.refresh_from_db()

    assert volume_basis(job) == "no_opt_in"
    scores = contribution_score_job(job=job)
    assert {s.method for s in scores} == {ContributionMethod.DATA_VOLUME}
    assert {s.site.slug: s.share for s in scores} == pytest.approx({a: 0.75, b: 0.25})
    basis = contribution_basis(job=job)
    assert basis["method"] == "data_volume" and basis["reason"] == "no_opt_in"
    assert "had not opted in to Shapley values" in basis["description"]

    client.force_login(world["pi"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "had not opted in to Shapley values when the job was launched" in page
    assert VOLUME_REASONS["no_opt_in"][:40] in page.replace("&#x27;", "'")


def test_queued_job_page_names_the_sites_not_opted_in(client, world):
    _opt_out(world["versions"][0])
    job = submit(world)
    slug = world["versions"][0].dataset.site.slug
    assert contribution_basis(job=job)["reason"] == "no_opt_in"
    client.force_login(world["pi"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert f"the data stewards of {slug} have not opted in" in page
    Dataset.objects.update(shapley_opt_in=True)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "every dataset's data steward has opted in, checked again at launch" in page
    assert contribution_basis(job=job)["method"] == "exact"


def test_job_form_marks_the_datasets_that_allow_shapley_values(client, world):
    _opt_out(world["versions"][1])
    client.force_login(world["pi"])
    response = client.get("/jobs/new/")
    field = response.context["form"].fields["datasets"]
    labels = {v.pk: field.label_from_instance(v) for v in field.queryset}
    assert labels[world["versions"][0].pk].endswith("· Shapley values allowed")
    assert "Shapley" not in labels[world["versions"][1].pk]
    assert "Shapley values only when every chosen dataset" in response.content.decode()


# --- the steward's rules: service and page ------------------------------------------------


def test_steward_sets_the_rules_audited_and_ledgered_without_free_text(world):
    dataset = world["versions"][0].dataset
    _opt_out(world["versions"][0])
    dataset.refresh_from_db()
    steward = _steward(dataset)
    leaves = LedgerEntry.objects.count()

    sandbox_services.dataset_rules_set(
        by=steward, dataset=dataset, auto_release=False, shapley_opt_in=True
    )

    dataset.refresh_from_db()
    assert dataset.shapley_opt_in is True and dataset.auto_release is False
    event = AuditEvent.objects.get(action="dataset.rules", target_id=str(dataset.pk))
    assert event.data["before"]["shapley_opt_in"] is False
    assert event.data["after"]["shapley_opt_in"] is True
    leaf = LedgerEntry.objects.order_by("-index").first()
    assert LedgerEntry.objects.count() == leaves + 1
    assert leaf.kind == "dataset.rules"
    import json

    assert json.loads(leaf.data) == {
        "kind": "dataset.rules",
        "dataset": dataset.pk,
        "site": dataset.site.slug,
        "auto_release": False,
        "shapley_opt_in": True,
    }
    # The same values again write nothing
    sandbox_services.dataset_rules_set(
        by=steward, dataset=dataset, auto_release=False, shapley_opt_in=True
    )
    assert LedgerEntry.objects.count() == leaves + 1


def test_only_the_datasets_own_stewards_set_its_rules(world):
    dataset = world["versions"][0].dataset
    other = _steward(world["versions"][1].dataset)
    if other.memberships.filter(institution=dataset.site.institution).exists():
        pytest.skip("both sites belong to one institution in this world")
    for user in (world["pi"], other):
        with pytest.raises(sandbox_services.AccessError, match="only a data steward"):
            sandbox_services.dataset_rules_set(
                by=user, dataset=dataset, auto_release=True, shapley_opt_in=True
            )
    dataset.refresh_from_db()
    assert dataset.auto_release is False


def test_rules_through_the_dataset_page(client, world):
    dataset = world["versions"][0].dataset
    _opt_out(world["versions"][0])
    steward = _steward(dataset)

    client.force_login(world["pi"])
    page = client.get(f"/datasets/{dataset.pk}/").content.decode()
    assert 'data-testid="dataset-rules"' not in page
    assert "its data steward has not opted in to Shapley values" in page
    assert (
        client.post(f"/datasets/{dataset.pk}/rules/", {"shapley_opt_in": "on"}).status_code == 403
    )

    client.force_login(steward)
    page = client.get(f"/datasets/{dataset.pk}/").content.decode()
    assert 'data-testid="dataset-rules"' in page and "Allow Shapley-value contribution" in page
    response = client.post(f"/datasets/{dataset.pk}/rules/", {"shapley_opt_in": "on"})
    assert response.status_code == 302
    dataset.refresh_from_db()
    assert dataset.shapley_opt_in is True and dataset.auto_release is False
    # Unticked boxes are absent from the body: both off
    client.post(f"/datasets/{dataset.pk}/rules/", {})
    dataset.refresh_from_db()
    assert dataset.shapley_opt_in is False
    assert client.get(f"/datasets/{dataset.pk}/rules/").status_code == 405
    assert client.post("/datasets/999999/rules/", {}).status_code == 404

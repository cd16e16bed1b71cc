"""Shapley values only with every data steward's opt-in (issue 9, F1; ADR 0036).

The closing evaluation of a Shapley job sends every site the model of every coalition, the one
trained on a single site's data included, so each site can recover the others' updates. A steward
opts a dataset in on its page (audited, ledgered); a job whose datasets are not all opted in runs
without coalition models (``contribution`` false in the run config, recorded on the job at
launch) and credits every site by data volume, and its pages say why. The real Flower run of the
same path is in ``test_integration.py`` (``test_opted_out_job_sends_no_coalition_model``).
"""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from accounting.models import ContributionMethod
from accounting.selectors.contribution import VOLUME_REASONS, volume_basis
from accounting.selectors.credit import contribution_basis
from accounting.services.contribution import contribution_score_job
from federation import services
from federation.models import FederatedJob, JobStatus
from federation.selectors import shapley_not_opted_in
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent, Role
from sandbox import services as sandbox_services
from sandbox.models import Dataset
from tests.factories import MembershipFactory, UserFactory
from tests.federation import test_services
from tests.federation.callback_support import record_one_round, record_round

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
    assert 'had opted in when the job was launched. <span id="job-contribution-method">' in page


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
    data = json.loads(leaf.data)
    assert data.pop("at").startswith(str(timezone.now().year))  # when, in the hashed leaf
    assert data == {
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
    # the other site's steward has no role at this dataset's institution (else the test proves nothing)
    assert not other.memberships.filter(institution=dataset.site.institution).exists()
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


# --- consent ending during the run (hostile re-test) -----------------------------------------


def _round_event(job, a, b, rnd=1):
    return record_round(job, rnd, {a: 40, b: 40})


def test_a_steward_withdrawing_during_the_run_ends_the_contribution_at_the_next_answer(
    client, world, fake_superlink, launch
):
    job = launch(world, num_rounds=3)
    a, b = (v.dataset.site.slug for v in world["versions"])
    assert _round_event(job, a, b)["contribution"] is True
    dataset = world["versions"][1].dataset
    sandbox_services.dataset_rules_set(
        by=_steward(dataset), dataset=dataset, auto_release=False, shapley_opt_in=False
    )
    leaves = LedgerEntry.objects.count()

    answer = _round_event(job, a, b, rnd=2)

    assert answer["contribution"] is False and answer["drop_sites"] == []
    job.refresh_from_db()
    assert job.shapley_consent is False
    event = AuditEvent.objects.get(action="job.shapley_consent_ended", target_id=str(job.pk))
    assert event.data["opt_in_withdrawn"] == [b] and event.data["grant_revoked"] == []
    leaf = json.loads(LedgerEntry.objects.order_by("-index").first().data)
    assert LedgerEntry.objects.count() == leaves + 1
    assert leaf["kind"] == "job.shapley_ended" and leaf["opt_in_withdrawn"] == [b]
    # Later answers say so too, writing nothing more; opting in again does not revive it
    Dataset.objects.update(shapley_opt_in=True)
    assert _round_event(job, a, b, rnd=3)["contribution"] is False
    assert LedgerEntry.objects.count() == leaves + 1
    # A contribution event the ServerApp would post anyway is refused, nothing stored
    from tests.accounting.job_world import utilities_event

    with pytest.raises(services.JobError, match="without its data stewards' Shapley opt-in"):
        from tests.federation.callback_support import record

        record(
            job,
            {
                "event": "contribution",
                **utilities_event([a, b], {"0": {"": 0.5, "0": 0.6, "1": 0.7, "0,1": 0.8}}),
            },
        )
    job.refresh_from_db()
    assert "contribution" not in job.final_metrics
    client.force_login(world["pi"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "or withdrew the opt-in or the grant during the run" in page


def test_a_grant_revoked_during_the_run_ends_the_contribution(world, fake_superlink, launch):
    job = launch(world)
    a, b = (v.dataset.site.slug for v in world["versions"])
    world["grants"][1].status = "revoked"
    world["grants"][1].save()
    answer = _round_event(job, a, b)
    assert b in answer["drop_sites"] and answer["contribution"] is False
    job.refresh_from_db()
    assert job.shapley_consent is False
    event = AuditEvent.objects.get(action="job.shapley_consent_ended", target_id=str(job.pk))
    assert event.data["grant_revoked"] == [b]


def test_the_launch_and_its_consent_are_in_the_ledger_and_the_audit(world, fake_superlink, launch):
    before = LedgerEntry.objects.count()
    _opt_out(world["versions"][1])
    job = launch(world)
    leaves = [json.loads(e.data) for e in LedgerEntry.objects.order_by("index")[before:]]
    (leaf,) = [x for x in leaves if x["kind"] == "job.launch"]
    assert leaf["job"] == job.pk and leaf["shapley_consent"] is False
    assert leaf["dataset_versions"] == sorted(v.pk for v in world["versions"])
    assert leaf["launch_nonce"] == job.launch_nonce and leaf["at"]
    event = AuditEvent.objects.get(action="job.launch", target_id=str(job.pk))
    assert event.data["shapley_consent"] is False


def test_a_requeued_job_shows_the_rule_its_next_launch_goes_by(
    client, world, fake_superlink, launch
):
    job = launch(world)
    assert job.shapley_consent is True
    FederatedJob.objects.filter(pk=job.pk).update(status=JobStatus.QUEUED)  # preempted, say
    _opt_out(world["versions"][0])
    job.refresh_from_db()
    client.force_login(world["pi"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    slug = world["versions"][0].dataset.site.slug
    assert f"the data stewards of {slug} have not opted in" in page
    assert contribution_basis(job=job)["reason"] == "no_opt_in"


def test_a_job_launched_before_the_opt_in_existed_says_so(client, world):
    job = submit(world)
    FederatedJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    Dataset.objects.update(shapley_opt_in=False)
    client.force_login(world["pi"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "launched before data stewards&#x27; opt-in existed" in page or (
        "launched before data stewards' opt-in existed" in page
    )


@pytest.mark.parametrize("value", ["off", "0", "no", "False ", "n", "true"])
def test_a_box_sent_as_anything_but_on_is_refused_and_changes_nothing(client, world, value):
    dataset = world["versions"][0].dataset
    _opt_out(world["versions"][0])
    client.force_login(_steward(dataset))
    response = client.post(f"/datasets/{dataset.pk}/rules/", {"shapley_opt_in": value})
    assert response.status_code == 400
    assert b'sent as "on" or not at all' in response.content
    dataset.refresh_from_db()
    assert dataset.shapley_opt_in is False


def test_a_layer_of_thousands_of_digits_is_refused_inline(client, world):
    client.force_login(world["pi"])
    response = client.post(
        "/jobs/new/",
        {
            "title": "t",
            "project": world["project"].pk,
            "datasets": [v.pk for v in world["versions"]],
            "target_column": "label",
            "num_rounds": 1,
            "local_epochs": 1,
            "learning_rate": 0.1,
            "model_kind": "mlp",
            "mlp_hidden": "9" * 5000,
        },
    )
    assert response.status_code == 200
    assert "at most 64 characters" in response.content.decode()


def test_the_end_leaf_says_whether_the_closing_message_may_have_gone_out(
    world, fake_superlink, launch
):
    job = launch(world, num_rounds=2)
    a, b = (v.dataset.site.slug for v in world["versions"])
    _opt_out(world["versions"][0])
    _round_event(job, a, b, rnd=2)  # the last round's event: the closing message went with it
    leaf = json.loads(LedgerEntry.objects.order_by("-index").first().data)
    assert leaf["kind"] == "job.shapley_ended"
    assert (leaf["event"], leaf["round"], leaf["closing_sent"]) == ("round", 2, True)
    assert leaf["opt_in_withdrawn"] == [a] and leaf["launched_before_opt_in"] is False


def test_a_job_launched_before_the_rule_is_recorded_as_such_not_as_a_withdrawal(
    world, fake_superlink, launch
):
    job = launch(world, num_rounds=3)
    FederatedJob.objects.filter(pk=job.pk).update(shapley_consent=None)  # as before 0016
    Dataset.objects.update(shapley_opt_in=False)  # the migration's default
    a, b = (v.dataset.site.slug for v in world["versions"])
    assert _round_event(job, a, b)["contribution"] is False
    leaf = json.loads(LedgerEntry.objects.order_by("-index").first().data)
    assert leaf["launched_before_opt_in"] is True and leaf["opt_in_withdrawn"] == []
    assert leaf["closing_sent"] is False

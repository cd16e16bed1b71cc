"""Airlock: a finished job's model is downloadable only after every participating site's data steward
(or that dataset's auto-release rule) approves; every decision is audited and a ledger leaf."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from federation import services
from federation.models import FederatedJob, JobSite, JobStatus, ReleaseStatus
from portal.ledger.merkle import leaf_hash
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent, Membership, ProjectRole, Role
from tests.factories import DatasetVersionFactory, ProjectFactory, ProjectMemberFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    project = ProjectFactory()
    researcher = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    versions = [DatasetVersionFactory(), DatasetVersionFactory()]
    stewards = []
    for v in versions:
        steward = UserFactory()
        Membership.objects.create(
            user=steward, institution=v.dataset.site.institution, role=Role.DATA_STEWARD
        )
        stewards.append(steward)
    job = FederatedJob.objects.create(
        project=project,
        submitted_by=researcher,
        title="done",
        target_column="label",
        status=JobStatus.COMPLETED,
        final_metrics={
            "eval_accuracy": 0.95,
            "classes": ["a", "b"],
            "model": [[[0.1, 0.2]], [0.0, 0.0]],
        },
    )
    for v in versions:
        JobSite.objects.create(job=job, site=v.dataset.site, dataset_version=v)
    return dict(
        project=project, researcher=researcher, versions=versions, stewards=stewards, job=job
    )


def _leaves(kind: str) -> list[dict]:
    out = []
    for entry in LedgerEntry.objects.filter(kind=kind).order_by("index"):
        assert bytes(entry.leaf_hash) == leaf_hash(entry.data.encode())  # RFC 9162 leaf
        out.append(json.loads(entry.data))
    return out


def _sites(w):
    return [v.dataset.site for v in w["versions"]]


def test_model_not_downloadable_until_every_site_approves(client, world):
    client.force_login(world["researcher"])
    download = reverse("federation:job_model_download", args=[world["job"].pk])
    assert client.get(download).status_code == 404

    client.post(reverse("federation:job_release_request", args=[world["job"].pk]))
    release = world["job"].release
    assert client.get(download).status_code == 404

    services.release_decide(
        by=world["stewards"][0], release_id=release.pk, site=_sites(world)[0], approve=True
    )
    assert client.get(download).status_code == 404  # one of two sites

    services.release_decide(
        by=world["stewards"][1], release_id=release.pk, site=_sites(world)[1], approve=True
    )
    response = client.get(download)
    assert response.status_code == 200
    assert response.json()["weights"] == world["job"].final_metrics["model"]
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"release.request", "release.approve", "release.approved"} <= actions


def test_one_refusal_refuses_the_release(world):
    release = services.release_request(by=world["researcher"], job=world["job"])
    with pytest.raises(services.ReleaseError, match="reason"):
        services.release_decide(
            by=world["stewards"][0], release_id=release.pk, site=_sites(world)[0], approve=False
        )
    services.release_decide(
        by=world["stewards"][0],
        release_id=release.pk,
        site=_sites(world)[0],
        approve=False,
        reason="small cell counts in site A",
    )
    release.refresh_from_db()
    assert release.status == ReleaseStatus.REFUSED


def test_a_steward_in_the_jobs_project_cannot_approve_its_release(world):
    """A data steward who is also in the job's project (here the PI, who asked for the release)
    would check their own output: another steward of the site approves."""
    site = _sites(world)[0]
    Membership.objects.create(
        user=world["researcher"], institution=site.institution, role=Role.DATA_STEWARD
    )
    member = ProjectMemberFactory(project=world["project"], role=ProjectRole.MEMBER).user
    Membership.objects.create(user=member, institution=site.institution, role=Role.DATA_STEWARD)
    release = services.release_request(by=world["researcher"], job=world["job"])

    for by in (world["researcher"], member):
        with pytest.raises(services.ReleaseError, match="another data steward"):
            services.release_decide(by=by, release_id=release.pk, site=site, approve=True)
    assert not release.decisions.exists()
    services.release_decide(by=world["stewards"][0], release_id=release.pk, site=site, approve=True)
    assert release.decisions.count() == 1


def test_steward_of_other_site_cannot_decide(world):
    release = services.release_request(by=world["researcher"], job=world["job"])
    with pytest.raises(services.ReleaseError, match="data steward"):
        services.release_decide(
            by=world["stewards"][1], release_id=release.pk, site=_sites(world)[0], approve=True
        )


def test_auto_release_rule_approves_for_its_site(world):
    for v in world["versions"]:
        v.dataset.auto_release = True
        v.dataset.save()
    release = services.release_request(by=world["researcher"], job=world["job"])
    assert release.status == ReleaseStatus.APPROVED
    assert all(d.by_rule for d in release.decisions.all())


def test_release_of_unfinished_job_refused(world):
    FederatedJob.objects.filter(pk=world["job"].pk).update(status=JobStatus.RUNNING)
    world["job"].refresh_from_db()
    with pytest.raises(services.ReleaseError, match="completed"):
        services.release_request(by=world["researcher"], job=world["job"])


def test_outsider_cannot_request_or_download(client, world):
    outsider = UserFactory()
    with pytest.raises(services.ReleaseError):
        services.release_request(by=outsider, job=world["job"])
    client.force_login(outsider)
    assert (
        client.get(reverse("federation:job_model_download", args=[world["job"].pk])).status_code
        == 404
    )


def test_steward_queue_lists_pending_release_for_their_site(client, world):
    services.release_request(by=world["researcher"], job=world["job"])
    client.force_login(world["stewards"][0])
    page = client.get(reverse("sandbox:steward_queue")).content.decode()
    assert "Model releases awaiting your decision" in page and _sites(world)[0].name in page
    assert _sites(world)[1].name not in page


def test_job_page_names_the_sites_still_to_decide(client, world):
    client.force_login(world["researcher"])
    client.post(reverse("federation:job_release_request", args=[world["job"].pk]))
    first, second = _sites(world)
    services.release_decide(
        by=world["stewards"][0], release_id=world["job"].release.pk, site=first, approve=True
    )

    page = client.get(reverse("federation:job_detail", args=[world["job"].pk])).content.decode()

    assert f"{second.name} — waiting for its data steward" in page
    assert f"{first.name} — waiting" not in page


def test_steward_sees_the_job_but_the_model_is_released_to_the_project_only(client, world):
    services.release_request(by=world["researcher"], job=world["job"])
    release = world["job"].release
    for steward, site in zip(world["stewards"], _sites(world), strict=True):
        services.release_decide(by=steward, release_id=release.pk, site=site, approve=True)
    client.force_login(world["stewards"][0])

    page = client.get(reverse("federation:job_detail", args=[world["job"].pk]))
    download = client.get(reverse("federation:job_model_download", args=[world["job"].pk]))

    assert page.status_code == 200 and "Download model" not in page.content.decode()
    assert download.status_code == 404
    with pytest.raises(services.ReleaseError, match="only members of this job's project"):
        services.release_request(by=world["stewards"][0], job=world["job"])


def test_release_decisions_append_ledger_leaves(world):
    v0, v1 = world["versions"]
    v0.dataset.auto_release = True
    v0.dataset.save()
    job = FederatedJob.objects.create(
        project=world["project"],
        submitted_by=world["researcher"],
        title="done",
        target_column="label",
        status=JobStatus.COMPLETED,
        final_metrics={"model": [[[0.1]], [0.0]], "classes": ["a", "b"]},
    )
    for v in (v0, v1):
        JobSite.objects.create(job=job, site=v.dataset.site, dataset_version=v)
    release = services.release_request(by=world["researcher"], job=job)
    services.release_decide(
        by=world["stewards"][1], release_id=release.pk, site=v1.dataset.site, approve=True
    )
    leaves = _leaves("model_release")
    assert [(x["site"], x["decision"], x["by_rule"], x["by"]) for x in leaves] == [
        (v0.dataset.site.slug, "approve", True, None),
        (v1.dataset.site.slug, "approve", False, world["stewards"][1].pk),
        (None, "approved", False, None),  # the release as a whole
    ]
    assert {x["release"] for x in leaves} == {release.pk} and {x["job"] for x in leaves} == {job.pk}
    assert [e.index for e in LedgerEntry.objects.order_by("index")] == [0, 1, 2]

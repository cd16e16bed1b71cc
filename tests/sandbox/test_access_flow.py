"""Access requests: a researcher asks with a purpose, the owning steward approves with an expiry or
refuses with a reason, and may revoke; through the services and end to end through the web pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from portal.models import AuditEvent, Membership, ProjectRole, Role
from sandbox import selectors, services
from sandbox.models import AccessRequest, AccessStatus
from tests.factories import (
    DatasetVersionFactory,
    ProjectFactory,
    ProjectMemberFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    dataset = DatasetVersionFactory().dataset
    steward = UserFactory()
    Membership.objects.create(
        user=steward, institution=dataset.site.institution, role=Role.DATA_STEWARD
    )
    outsider_steward = UserFactory()
    Membership.objects.create(
        user=outsider_steward, institution=ProjectFactory().institution, role=Role.DATA_STEWARD
    )
    project = ProjectFactory()
    researcher = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    return dict(
        dataset=dataset,
        steward=steward,
        outsider=outsider_steward,
        project=project,
        researcher=researcher,
    )


def _request(w):
    return services.access_request_submit(
        by=w["researcher"], dataset=w["dataset"], project=w["project"], purpose="train a model"
    )


def test_request_by_non_member_refused(world):
    with pytest.raises(services.AccessError, match="not a member"):
        services.access_request_submit(
            by=UserFactory(), dataset=world["dataset"], project=world["project"], purpose="x"
        )


def test_request_without_purpose_refused(world):
    with pytest.raises(services.AccessError, match="purpose"):
        services.access_request_submit(
            by=world["researcher"], dataset=world["dataset"], project=world["project"], purpose=" "
        )


def test_duplicate_pending_request_refused(world):
    _request(world)
    with pytest.raises(services.AccessError, match="pending"):
        _request(world)


def test_approve_needs_future_expiry_and_grants_until_then(world):
    req = _request(world)
    with pytest.raises(services.AccessError, match="expiry"):
        services.access_request_decide(by=world["steward"], request_id=req.pk, approve=True)
    until = timezone.now() + timedelta(days=30)
    services.access_request_decide(
        by=world["steward"], request_id=req.pk, approve=True, expires_at=until
    )
    assert selectors.has_valid_grant(project=world["project"], dataset=world["dataset"])
    assert not selectors.has_valid_grant(
        project=world["project"], dataset=world["dataset"], at=until + timedelta(seconds=1)
    )
    assert AuditEvent.objects.filter(action="access.approve", target_id=str(req.pk)).exists()


def test_refuse_needs_reason(world):
    req = _request(world)
    with pytest.raises(services.AccessError, match="reason"):
        services.access_request_decide(by=world["steward"], request_id=req.pk, approve=False)
    services.access_request_decide(
        by=world["steward"], request_id=req.pk, approve=False, reason="no ethics approval"
    )
    req.refresh_from_db()
    assert (req.status, req.decision_reason) == (AccessStatus.REFUSED, "no ethics approval")


def test_steward_of_another_institution_cannot_decide(world):
    req = _request(world)
    with pytest.raises(services.AccessError):
        services.access_request_decide(
            by=world["outsider"],
            request_id=req.pk,
            approve=True,
            expires_at=timezone.now() + timedelta(days=1),
        )
    assert AccessRequest.objects.get(pk=req.pk).status == AccessStatus.PENDING


def test_revoke_ends_grant(world):
    req = _request(world)
    services.access_request_decide(
        by=world["steward"],
        request_id=req.pk,
        approve=True,
        expires_at=timezone.now() + timedelta(days=3),
    )
    services.access_grant_revoke(by=world["steward"], request_id=req.pk, reason="consent withdrawn")
    assert not selectors.has_valid_grant(project=world["project"], dataset=world["dataset"])
    assert AuditEvent.objects.filter(action="access.revoke").exists()


def test_approval_flow_through_the_web_pages(client, world):
    # The researcher asks on the dataset page.
    client.force_login(world["researcher"])
    url = reverse("sandbox:dataset_detail", args=[world["dataset"].pk])
    assert "Request access" in client.get(url).content.decode()
    response = client.post(url, {"project": world["project"].pk, "purpose": "diagnostic model"})
    assert response.status_code == 302
    req = AccessRequest.objects.get()

    # Another institution's steward sees nothing and cannot decide (404).
    client.force_login(world["outsider"])
    assert "diagnostic model" not in client.get(reverse("sandbox:steward_queue")).content.decode()
    decide = reverse("sandbox:request_decide", args=[req.pk])
    assert (
        client.post(decide, {"decision": "approve", "expires_on": "2099-01-01"}).status_code == 404
    )

    # The owning steward approves without an expiry: refused with a message; then with one.
    client.force_login(world["steward"])
    assert "diagnostic model" in client.get(reverse("sandbox:steward_queue")).content.decode()
    client.post(decide, {"decision": "approve"})
    assert AccessRequest.objects.get().status == AccessStatus.PENDING
    tomorrow = (timezone.now() + timedelta(days=2)).date().isoformat()
    client.post(decide, {"decision": "approve", "expires_on": tomorrow})
    req.refresh_from_db()
    assert req.status == AccessStatus.APPROVED
    assert req.expires_at.date().isoformat() == tomorrow  # valid through the chosen day (UTC)
    assert (req.expires_at.hour, req.expires_at.minute) == (23, 59)

    # The researcher's job form now offers the dataset.
    client.force_login(world["researcher"])
    form = client.get(reverse("federation:job_create")).content.decode()
    version = world["dataset"].latest_version
    assert f'name="datasets" value="{version.pk}"' in form

    # Revoked by the steward: gone from the grants.
    client.force_login(world["steward"])
    client.post(reverse("sandbox:grant_revoke", args=[req.pk]), {"reason": "study closed"})
    assert AccessRequest.objects.get().status == AccessStatus.REVOKED


def test_non_steward_has_no_queue(client, world):
    client.force_login(world["researcher"])
    assert client.get(reverse("sandbox:steward_queue")).status_code == 404


def test_revoking_needs_a_reason_and_keeps_the_grant_without_one(world):
    req = services.access_request_submit(
        by=world["researcher"], dataset=world["dataset"], project=world["project"], purpose="p"
    )
    services.access_request_decide(
        by=world["steward"],
        request_id=req.pk,
        approve=True,
        expires_at=timezone.now() + timedelta(days=30),
    )

    with pytest.raises(services.AccessError, match="reason"):
        services.access_grant_revoke(by=world["steward"], request_id=req.pk, reason="  ")

    req.refresh_from_db()
    assert req.status == AccessStatus.APPROVED


@pytest.mark.parametrize("second", ["approve", "refuse"])
def test_deciding_an_already_decided_request_is_a_message_not_a_500(client, world, second):
    """Issue 9, finding 7: a second decision (another steward, another tab) raised ValueError."""
    req = _request(world)
    tomorrow = (timezone.now() + timedelta(days=2)).date().isoformat()
    client.force_login(world["steward"])
    decide = reverse("sandbox:request_decide", args=[req.pk])
    client.post(decide, {"decision": "approve", "expires_on": tomorrow})
    decided = AccessRequest.objects.get(pk=req.pk)

    response = client.post(
        decide,
        {"decision": second, "expires_on": tomorrow, "reason": "changed my mind"},
        follow=True,
    )

    assert response.status_code == 200
    assert "already decided (approved); nothing was changed" in response.content.decode()
    again = AccessRequest.objects.get(pk=req.pk)
    assert (again.status, again.decided_at, again.decision_reason) == (
        decided.status,
        decided.decided_at,
        decided.decision_reason,
    )

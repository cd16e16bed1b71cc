"""Every access decision (approve, refuse, revoke) and every airlock decision appends a ledger leaf in
the decision's own transaction; and the approval flow end to end through the web pages, down to a
job submission that a grant allows and a refusal blocks."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from federation.models import FederatedJob
from portal.ledger.leaves import commitment_matches
from portal.ledger.merkle import leaf_hash
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent, Membership, ProjectRole, Role
from sandbox import services
from sandbox.models import AccessRequest, AccessStatus
from tests.factories import DatasetVersionFactory, ProjectFactory, ProjectMemberFactory, UserFactory

pytestmark = pytest.mark.django_db


def _leaves(kind: str) -> list[dict]:
    out = []
    for entry in LedgerEntry.objects.filter(kind=kind).order_by("index"):
        assert bytes(entry.leaf_hash) == leaf_hash(entry.data.encode())  # RFC 9162 leaf
        out.append(json.loads(entry.data))
    return out


@pytest.fixture
def world():
    versions = [DatasetVersionFactory(), DatasetVersionFactory()]
    stewards = []
    for v in versions:
        steward = UserFactory()
        Membership.objects.create(
            user=steward, institution=v.dataset.site.institution, role=Role.DATA_STEWARD
        )
        stewards.append(steward)
    project = ProjectFactory()
    researcher = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    return dict(versions=versions, stewards=stewards, project=project, researcher=researcher)


def _ask(w, i: int) -> AccessRequest:
    return services.access_request_submit(
        by=w["researcher"], dataset=w["versions"][i].dataset, project=w["project"], purpose="p"
    )


def test_access_decisions_append_ledger_leaves(world):
    steward = world["stewards"][0]
    req = _ask(world, 0)
    until = timezone.now() + timedelta(days=10)
    services.access_request_decide(by=steward, request_id=req.pk, approve=True, expires_at=until)
    services.access_grant_revoke(by=steward, request_id=req.pk, reason="consent withdrawn")
    refused = _ask(world, 0)
    services.access_request_decide(
        by=steward, request_id=refused.pk, approve=False, reason="no ethics approval"
    )

    leaves = _leaves("access_decision")
    assert [leaf["decision"] for leaf in leaves] == ["approve", "revoke", "refuse"]
    assert [leaf["access_request"] for leaf in leaves] == [req.pk, req.pk, refused.pk]
    assert {leaf["by"] for leaf in leaves} == {steward.pk}
    assert leaves[0]["expires_at"] == until.isoformat()
    salt = AuditEvent.objects.get(action="access.reason_commitment", data__decision="revoke")
    assert commitment_matches(
        "consent withdrawn",
        commitment_hex=leaves[1]["reason_commitment"],
        salt_hex=salt.data["reason_salt"],
    )
    assert leaves[0]["reason_commitment"] is None  # an approval without a note
    assert all("reason" not in leaf for leaf in leaves)
    req.refresh_from_db()
    assert leaves[1]["time"] == req.decided_at.isoformat()
    assert all(
        leaf["project"] == world["project"].pk and leaf["kind"] == "access_decision"
        for leaf in leaves
    )


def test_refusal_reason_stays_out_of_the_ledger_and_in_the_audit_log(world):
    """Issue 9, finding 4: a refusal's free text reached a leaf every institution reads."""
    steward = world["stewards"][0]
    secret = "under investigation for a data breach (confidential)"
    req = _ask(world, 0)

    services.access_request_decide(by=steward, request_id=req.pk, approve=False, reason=secret)

    assert not any(secret in e.data for e in LedgerEntry.objects.all())
    (leaf,) = _leaves("access_decision")
    audit = AuditEvent.objects.get(action="access.refuse", target_id=str(req.pk))
    assert audit.data["reason"] == secret  # the parties still read it where it belongs


def test_a_refusal_reason_cannot_be_confirmed_by_guessing(world):
    """Hostile re-test, finding 4: the leaf held the reason's unsalted SHA-256, and a member of an
    uninvolved institution confirmed the confidential reason by hashing 5 guesses. The leaf now
    holds HMAC-SHA256 with a random salt that stays in the audit log beside the text."""
    steward = world["stewards"][0]
    secret = "under investigation for a data breach (confidential)"
    req = _ask(world, 0)

    services.access_request_decide(by=steward, request_id=req.pk, approve=False, reason=secret)

    (entry,) = LedgerEntry.objects.filter(kind="access_decision")
    leaf = json.loads(entry.data)
    guesses = [secret, "no ethics approval", "consent withdrawn", "", "confidential"]
    for guess in guesses:  # the tester's oracle: the plain and the hex digest of each guess
        digest = hashlib.sha256(guess.encode()).hexdigest()
        assert digest not in entry.data
        assert leaf["reason_commitment"] != digest
    opened = AuditEvent.objects.get(action="access.reason_commitment", target_id=str(req.pk))
    assert opened.data["reason"] == secret
    assert commitment_matches(
        secret, commitment_hex=leaf["reason_commitment"], salt_hex=opened.data["reason_salt"]
    )
    assert not commitment_matches(
        "no ethics approval",
        commitment_hex=leaf["reason_commitment"],
        salt_hex=opened.data["reason_salt"],
    )


def test_refused_decision_attempt_appends_nothing(world):
    req = _ask(world, 0)
    with pytest.raises(services.AccessError):  # another institution's steward
        services.access_request_decide(
            by=world["stewards"][1],
            request_id=req.pk,
            approve=True,
            expires_at=timezone.now() + timedelta(days=1),
        )
    with pytest.raises(services.AccessError):  # a refusal needs a reason
        services.access_request_decide(by=world["stewards"][0], request_id=req.pk, approve=False)
    assert not LedgerEntry.objects.exists()


def test_approval_flow_end_to_end_through_the_web_pages(client, world):
    v0, v1 = world["versions"]
    researcher, project = world["researcher"], world["project"]
    # The researcher asks for both datasets on their pages.
    client.force_login(researcher)
    for v in (v0, v1):
        url = reverse("sandbox:dataset_detail", args=[v.dataset.pk])
        assert client.post(url, {"project": project.pk, "purpose": "a model"}).status_code == 302
    r0, r1 = (AccessRequest.objects.get(dataset=v.dataset) for v in (v0, v1))

    # Steward 0 approves; steward 1 refuses with a reason, which the researcher then reads.
    day = (timezone.now() + timedelta(days=5)).date().isoformat()
    client.force_login(world["stewards"][0])
    client.post(
        reverse("sandbox:request_decide", args=[r0.pk]), {"decision": "approve", "expires_on": day}
    )
    client.force_login(world["stewards"][1])
    client.post(reverse("sandbox:request_decide", args=[r1.pk]), {"decision": "refuse"})
    assert AccessRequest.objects.get(pk=r1.pk).status == AccessStatus.PENDING  # no reason given
    client.post(
        reverse("sandbox:request_decide", args=[r1.pk]),
        {"decision": "refuse", "reason": "the cohort excludes this purpose"},
    )
    assert AccessRequest.objects.get(pk=r1.pk).status == AccessStatus.REFUSED
    client.force_login(researcher)
    page = client.get(reverse("sandbox:dataset_detail", args=[v1.dataset.pk])).content.decode()
    assert "Refused" in page and "the cohort excludes this purpose" in page

    # A job over both: the refused dataset is not a valid choice, nothing is submitted.
    job_form = {
        "title": "fl",
        "project": project.pk,
        "datasets": [v0.pk, v1.pk],
        "target_column": "label",
        "feature_columns": "x1, x2",
        "num_rounds": 2,
        "local_epochs": 1,
        "learning_rate": 0.1,
    }
    response = client.post(reverse("federation:job_create"), job_form)
    assert response.status_code == 200 and not FederatedJob.objects.exists()

    # A new request is approved by steward 1: the same submission now creates the job.
    client.post(
        reverse("sandbox:dataset_detail", args=[v1.dataset.pk]),
        {"project": project.pk, "purpose": "a narrower model"},
    )
    r1b = AccessRequest.objects.get(dataset=v1.dataset, status=AccessStatus.PENDING)
    client.force_login(world["stewards"][1])
    client.post(
        reverse("sandbox:request_decide", args=[r1b.pk]), {"decision": "approve", "expires_on": day}
    )
    client.force_login(researcher)
    response = client.post(reverse("federation:job_create"), job_form)
    job = FederatedJob.objects.get()
    assert response.status_code == 302 and response["Location"].endswith(f"/{job.pk}/")
    assert set(job.sites.values_list("dataset_version", flat=True)) == {v0.pk, v1.pk}
    assert [x["decision"] for x in _leaves("access_decision")] == ["approve", "refuse", "approve"]

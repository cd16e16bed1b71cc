"""Writes of the sandbox: dataset registration (metadata only) and access decisions."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from portal.services import audit_record
from sandbox.models import AccessRequest, AccessStatus, Dataset, DatasetVersion


def dataset_next_version(*, site, slug: str) -> int:
    """The version number the next ingest of ``site``/``slug`` must use (it is bound into the AAD)."""
    latest = DatasetVersion.objects.filter(dataset__site=site, dataset__slug=slug).aggregate(
        v=Max("version")
    )["v"]
    return (latest or 0) + 1


@transaction.atomic
def dataset_version_register(
    *, by, site, slug: str, title: str, version: int, result, description: str = ""
) -> DatasetVersion:
    """Record the metadata of a finished site-side ingest (``sandbox.ingest.IngestResult``).

    The rows stay in the site's store; only schema, counts, hash, key and the suppressed profile are
    stored. Raises ``IntegrityError`` when ``version`` was taken meanwhile.
    """
    dataset, _ = Dataset.objects.get_or_create(
        site=site,
        slug=slug,
        defaults={"title": title, "description": description, "created_by": by},
    )
    dv = DatasetVersion.objects.create(
        dataset=dataset,
        version=version,
        schema=result.schema,
        row_count=result.row_count,
        size_bytes=result.size_bytes,
        ciphertext_sha256=result.ciphertext_sha256,
        store_key=result.store_key,
        profile=result.profile,
        created_by=by,
    )
    audit_record(
        by=by,
        action="dataset.register",
        target=dv,
        institution=site.institution,
        rows=result.row_count,
        sha256=result.ciphertext_sha256,
    )
    return dv


@transaction.atomic
def access_request_create(*, by, dataset: Dataset, project, purpose: str) -> AccessRequest:
    """A researcher asks to use ``dataset`` in ``project`` for ``purpose``."""
    request = AccessRequest.objects.create(
        dataset=dataset, project=project, requested_by=by, purpose=purpose
    )
    audit_record(
        by=by, action="access.request", target=request, institution=dataset.site.institution
    )
    return request


@transaction.atomic
def access_request_approve(
    *, by, request: AccessRequest, expires_at: datetime | None, reason: str = ""
) -> AccessRequest:
    """The owning institution's data steward approves a pending request until ``expires_at``."""
    request = AccessRequest.objects.select_for_update().get(pk=request.pk)
    if request.status != AccessStatus.PENDING:
        raise ValueError(f"request is {request.status}, not pending")
    request.status = AccessStatus.APPROVED
    request.decided_by = by
    request.decided_at = timezone.now()
    request.expires_at = expires_at
    request.decision_reason = reason
    request.save()
    audit_record(
        by=by,
        action="access.approve",
        target=request,
        institution=request.dataset.site.institution,
        expires_at=expires_at.isoformat() if expires_at else None,
    )
    return request


def _check_steward(by, request: AccessRequest) -> None:
    from portal.permissions import can

    if not can(by, "access.decide", request.dataset):
        raise AccessError("only a data steward of the dataset's institution decides")


class AccessError(Exception):
    """An access request cannot be made or decided; the message says why."""


@transaction.atomic
def access_request_submit(*, by, dataset: Dataset, project, purpose: str) -> AccessRequest:
    """A project member asks for ``dataset`` with a stated ``purpose`` (checked, then recorded)."""
    from portal.permissions import can

    if not can(by, "project.view", project):
        raise AccessError("you are not a member of this project")
    if not purpose.strip():
        raise AccessError("state the purpose of the request")
    if AccessRequest.objects.filter(
        dataset=dataset, project=project, status=AccessStatus.PENDING
    ).exists():
        raise AccessError("this project already has a pending request for this dataset")
    return access_request_create(by=by, dataset=dataset, project=project, purpose=purpose.strip())


@transaction.atomic
def access_request_decide(
    *, by, request_id: int, approve: bool, expires_at: datetime | None = None, reason: str = ""
) -> AccessRequest:
    """The steward approves until ``expires_at`` (required, in the future) or refuses with a reason."""
    request = (
        AccessRequest.objects.select_for_update().select_related("dataset__site").get(pk=request_id)
    )
    _check_steward(by, request)
    if approve:
        if expires_at is None or expires_at <= timezone.now():
            raise AccessError("an approval needs an expiry date in the future")
        return access_request_approve(by=by, request=request, expires_at=expires_at, reason=reason)
    if request.status != AccessStatus.PENDING:
        raise AccessError(f"request is {request.status}, not pending")
    if not reason.strip():
        raise AccessError("give the researcher a reason for the refusal")
    return _access_close(request, by=by, status=AccessStatus.REFUSED, reason=reason.strip())


def _access_close(request: AccessRequest, *, by, status: str, reason: str) -> AccessRequest:
    """Refuse or revoke ``request`` (already locked and checked), audited as ``access.<verb>``."""
    request.status = status
    request.decided_by = by
    request.decided_at = timezone.now()
    request.decision_reason = reason
    request.save()
    verb = {AccessStatus.REFUSED: "refuse", AccessStatus.REVOKED: "revoke"}[status]
    audit_record(
        by=by,
        action=f"access.{verb}",
        target=request,
        institution=request.dataset.site.institution,
        reason=reason,
    )
    return request


@transaction.atomic
def access_grant_revoke(*, by, request_id: int, reason: str) -> AccessRequest:
    """Revoke an approved grant: future jobs cannot use it and running jobs drop the site next round."""
    request = (
        AccessRequest.objects.select_for_update().select_related("dataset__site").get(pk=request_id)
    )
    _check_steward(by, request)
    if request.status != AccessStatus.APPROVED:
        raise AccessError(f"request is {request.status}, not approved")
    return _access_close(
        request,
        by=by,
        status=AccessStatus.REVOKED,
        reason=reason.strip() or "revoked by the data steward",
    )


# ---------------------------------------------------------------------------------------------
# Airlock: model release
# ---------------------------------------------------------------------------------------------


class ReleaseError(Exception):
    """A model release cannot be requested or decided; the message says why."""


def _release_settle(release) -> None:
    """Approve when every participating site approved; refuse on the first refusal."""
    from sandbox.models import ReleaseStatus

    sites = {js.site_id for js in release.job.sites.all()}
    decisions = {d.site_id: d.approve for d in release.decisions.all()}
    if any(approve is False for approve in decisions.values()):
        release.status = ReleaseStatus.REFUSED
    elif sites and sites <= set(decisions):
        release.status = ReleaseStatus.APPROVED
    else:
        return
    release.decided_at = timezone.now()
    release.save(update_fields=["status", "decided_at"])
    audit_record(
        by=None,
        action=f"release.{release.status}",
        target=release,
        institution=release.job.project.institution,
    )


@transaction.atomic
def release_request(*, by, job):
    """A project member asks to take a COMPLETED job's model out; sites with an auto-release rule
    on their dataset approve at once, the others wait for their data steward. Idempotent."""
    from federation.models import JobStatus
    from portal.permissions import can
    from sandbox.models import ModelRelease, ReleaseDecision

    if not can(by, "job.view", job):
        raise ReleaseError("you are not a member of this job's project")
    if job.status != JobStatus.COMPLETED or not job.final_metrics.get("model"):
        raise ReleaseError("only a completed job with a final model can be released")
    release, created = ModelRelease.objects.get_or_create(job=job, defaults={"requested_by": by})
    if not created:
        return release
    audit_record(
        by=by, action="release.request", target=release, institution=job.project.institution
    )
    for js in job.sites.select_related("dataset_version__dataset", "site"):
        if js.dataset_version.dataset.auto_release:
            ReleaseDecision.objects.create(
                release=release,
                site=js.site,
                approve=True,
                by_rule=True,
                reason="the dataset's auto-release rule",
            )
            audit_record(
                by=None,
                action="release.approve_by_rule",
                target=release,
                institution=js.site.institution,
                site=js.site.slug,
            )
    _release_settle(release)
    return release


@transaction.atomic
def release_decide(*, by, release_id: int, site, approve: bool, reason: str = ""):
    """A data steward of ``site``'s institution approves or refuses (with a reason) the release."""
    from portal.models import Role
    from sandbox.models import ModelRelease, ReleaseDecision, ReleaseStatus

    release = (
        ModelRelease.objects.select_for_update().select_related("job__project").get(pk=release_id)
    )
    if not release.job.sites.filter(site=site).exists():
        raise ReleaseError("this site did not take part in the job")
    if not by.memberships.filter(institution=site.institution, role=Role.DATA_STEWARD).exists():
        raise ReleaseError("only a data steward of the site's institution decides")
    if release.status != ReleaseStatus.PENDING:
        raise ReleaseError(f"the release is already {release.get_status_display().lower()}")
    if not approve and not reason.strip():
        raise ReleaseError("give a reason for the refusal")
    if release.decisions.filter(site=site).exists():
        raise ReleaseError("this site has already decided")
    ReleaseDecision.objects.create(
        release=release, site=site, approve=approve, decided_by=by, reason=reason.strip()
    )
    audit_record(
        by=by,
        action="release.approve" if approve else "release.refuse",
        target=release,
        institution=site.institution,
        site=site.slug,
        reason=reason.strip(),
    )
    _release_settle(release)
    return release

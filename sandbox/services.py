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

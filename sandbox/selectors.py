"""Reads of the sandbox, scoped by project grants."""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from sandbox.models import AccessRequest, AccessStatus, DatasetVersion


def valid_grants(*, project, at=None):
    """Approved, unexpired access requests of ``project``."""
    at = at or timezone.now()
    return AccessRequest.objects.filter(project=project, status=AccessStatus.APPROVED).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=at)
    )


def usable_versions(*, projects, at=None):
    """Latest dataset versions that hold a valid grant for any of ``projects``, site joined."""
    at = at or timezone.now()
    granted = AccessRequest.objects.filter(
        project__in=projects, status=AccessStatus.APPROVED
    ).filter(Q(expires_at__isnull=True) | Q(expires_at__gt=at))
    versions = DatasetVersion.objects.filter(dataset__in=granted.values("dataset")).select_related(
        "dataset__site__institution"
    )
    latest: dict[int, DatasetVersion] = {}
    for v in versions:
        if v.dataset_id not in latest or v.version > latest[v.dataset_id].version:
            latest[v.dataset_id] = v
    return sorted(latest.values(), key=lambda v: (v.dataset.site.slug, v.dataset.slug))


def has_valid_grant(*, project, dataset, at=None) -> bool:
    """True when ``project`` may use ``dataset`` now."""
    return valid_grants(project=project, at=at).filter(dataset=dataset).exists()

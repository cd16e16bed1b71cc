"""Reads of the sandbox, scoped by project grants."""

from __future__ import annotations

from django.db.models import Prefetch, Q
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


def dataset_catalogue(*, q: str = ""):
    """Every registered dataset with its site, institution and latest version (metadata only)."""
    from sandbox.models import Dataset

    datasets = Dataset.objects.select_related("site__institution").prefetch_related(
        Prefetch("versions", queryset=DatasetVersion.objects.defer("profile"))
    )
    if q:
        datasets = datasets.filter(
            Q(title__icontains=q)
            | Q(description__icontains=q)
            | Q(site__institution__name__icontains=q)
        )
    return datasets.order_by("site__institution__name", "title")


def steward_requests(*, user, status: str | None = None):
    """Access requests for datasets of institutions where ``user`` is a data steward."""
    from portal.models import Membership, Role

    stewarded = Membership.objects.filter(user=user, role=Role.DATA_STEWARD)
    qs = AccessRequest.objects.filter(
        dataset__site__institution__in=stewarded.values("institution_id")
    ).select_related(
        "dataset__site__institution", "project__institution", "requested_by", "decided_by"
    )
    if status:
        qs = qs.filter(status=status)
    return qs.order_by("-created_at", "-pk")


def upload_sites(*, user):
    """Sites where ``user`` may upload datasets: a data steward of the site's institution, and the
    site runs beside the portal (``sandbox.sitestore.local_site_storage``). A queryset."""
    from portal.models import Role, Site
    from sandbox.sitestore import local_site_storage

    stewarded = Site.objects.filter(
        institution__memberships__user=user, institution__memberships__role=Role.DATA_STEWARD
    ).distinct()
    local = [s.pk for s in stewarded if local_site_storage(s) is not None]
    return Site.objects.filter(pk__in=local).select_related("institution").order_by("slug")


def can_upload_to(*, user, site) -> bool:
    """Whether ``user`` may upload to ``site`` (as ``upload_sites``, for one site)."""
    from portal.permissions import can
    from sandbox.sitestore import local_site_storage

    return can(user, "dataset.register", site) and local_site_storage(site) is not None


def stewarded_institution_ids(*, user) -> set[int]:
    """Ids of the institutions where ``user`` is a data steward: whose datasets' exact row counts
    and sizes the user sees (everyone else sees them under the profile's disclosure rule)."""
    from portal.models import Role

    if not getattr(user, "is_authenticated", False):
        return set()
    return set(
        user.memberships.filter(role=Role.DATA_STEWARD).values_list("institution_id", flat=True)
    )


def is_steward(*, user) -> bool:
    """Whether ``user`` is a data steward of any institution."""
    from portal.models import Role

    return user.memberships.filter(role=Role.DATA_STEWARD).exists()


def dataset_versions(*, dataset):
    """Every version of ``dataset``, newest first, with who registered it."""
    return dataset.versions.select_related("created_by").order_by("-version")


def schema_change(*, version: DatasetVersion) -> str:
    """How ``version``'s schema differs from the dataset's previous version, in words (``""``
    when it is the first version or the columns and types are the same)."""
    previous = (
        DatasetVersion.objects.filter(dataset_id=version.dataset_id, version__lt=version.version)
        .order_by("-version")
        .first()
    )
    if previous is None:
        return ""
    old = {c["name"]: c["type"] for c in previous.schema}
    new = {c["name"]: c["type"] for c in version.schema}
    parts = []
    if gone := [n for n in old if n not in new]:
        parts.append("dropped " + ", ".join(gone))
    if added := [n for n in new if n not in old]:
        parts.append("added " + ", ".join(added))
    if retyped := [f"{n} {old[n]}→{new[n]}" for n in old if n in new and old[n] != new[n]]:
        parts.append("retyped " + ", ".join(retyped))
    return "; ".join(parts)


def privacy_budgets(*, project, dataset_ids) -> dict[int, float]:
    """dataset id → the ε budget the project has on it (datasets without one are absent)."""
    from sandbox.models import PrivacyBudget

    return dict(
        PrivacyBudget.objects.filter(project=project, dataset_id__in=list(dataset_ids)).values_list(
            "dataset_id", "epsilon"
        )
    )


def budgets_for_requests(requests) -> dict[int, float]:
    """access request id → the ε budget of its (project, dataset), for a page of requests."""
    from sandbox.models import PrivacyBudget

    requests = list(requests)
    pairs = {(r.project_id, r.dataset_id): r.pk for r in requests}
    if not pairs:
        return {}
    rows = PrivacyBudget.objects.filter(
        project_id__in={p for p, _ in pairs}, dataset_id__in={d for _, d in pairs}
    ).values_list("project_id", "dataset_id", "epsilon")
    return {pairs[(p, d)]: eps for p, d, eps in rows if (p, d) in pairs}


def shapley_not_opted_in(*, version_ids) -> list[str]:
    """Site slugs, sorted, of the dataset versions ``version_ids`` (ids or a subquery of them)
    whose dataset's steward has not opted in to Shapley-value contribution
    (``Dataset.shapley_opt_in``, ADR 0036); ``[]`` when every one has. One query."""
    return sorted(
        DatasetVersion.objects.filter(
            pk__in=version_ids, dataset__shapley_opt_in=False
        ).values_list("dataset__site__slug", flat=True)
    )

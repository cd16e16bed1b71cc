"""The one permission entry point: ``can(user, action, obj)``.

Every view and selector asks here. Objects a user may not see are answered with 404 by the caller
(``get_object_or_404`` on a permission-scoped queryset), so another institution's private objects do
not reveal that they exist.
"""

from __future__ import annotations

from django.db.models import Q

from portal.models import Membership, ProjectMember, ProjectRole, Role


def _project_role(user, project) -> str | None:
    return (
        ProjectMember.objects.filter(user=user, project=project)
        .values_list("role", flat=True)
        .first()
    )


def _has_role(user, institution, role: str) -> bool:
    return Membership.objects.filter(user=user, institution=institution, role=role).exists()


ACTIONS = frozenset(
    {
        "project.create",
        "project.view",
        "project.invite",
        "job.submit",
        "job.view",
        "job.stop",
        "job.resume",
        "institution.admin",
        "dataset.register",
        "access.decide",
        "price.manage",
        "pool.manage",
        "invoice.view",
        "job.view_cost",
        "job.view_accounting",
        "job.retry_accounting",
        "credit.view",
        "credit.edit",
        "ledger.view",
    }
)


def can(user, action: str, obj=None) -> bool:
    """True when ``user`` may do ``action`` on ``obj``.

    Actions: ``project.create`` (obj: None; researchers), ``project.view``, ``project.invite``
    (PI only), ``job.submit`` (obj: Project), ``job.view`` (obj: FederatedJob; the project's
    members, platform admins, the data stewards and admins of an institution whose site takes
    part, and the admins of the project's institution), ``job.stop`` (obj: FederatedJob;
    submitter or PI), ``job.resume`` (obj: FederatedJob; its submitter, still a member),
    ``institution.admin`` (obj: Institution; platform admins too),
    ``dataset.register`` (obj: Site), ``access.decide`` (obj: Dataset or Site),
    ``price.manage`` and ``pool.manage`` (obj: ComputePool: its settings, calendar, queue), ``invoice.view`` (obj: Invoice or Institution):
    the institution's admins (and platform admins); ``job.view_cost`` and ``credit.view``
    (obj: FederatedJob): the project's members, platform admins and the admins of the
    project's and the job's sites' institutions; ``credit.edit`` (obj: FederatedJob): PIs of
    its project only. ``job.view_accounting`` and ``job.retry_accounting`` (obj: FederatedJob;
    the state of its accounting steps, and queueing them again): platform admins and the admins
    of the project's and the job's sites' institutions.
    ``ledger.view`` (obj: None; any member of an institution, and platform admins).
    Unknown actions raise ``ValueError`` so a typo cannot silently allow or deny.
    """
    if action not in ACTIONS:
        raise ValueError(f"unknown action {action!r}")
    if user is None or not user.is_authenticated or not user.is_active:
        return False
    if action in {"project.view", "job.submit"}:
        return _project_role(user, obj) is not None
    if action == "project.invite":
        return _project_role(user, obj) == ProjectRole.PRINCIPAL_INVESTIGATOR
    if action == "project.create":
        return Membership.objects.filter(user=user, role=Role.RESEARCHER).exists()
    if action == "job.view":  # the project, and those whose institution took part or leads it
        if user.is_staff or _project_role(user, obj.project) is not None:
            return True
        sites = set(obj.sites.values_list("site__institution_id", flat=True))
        return (
            Membership.objects.filter(user=user)
            .filter(
                Q(institution_id__in=sites, role__in=[Role.DATA_STEWARD, Role.INSTITUTION_ADMIN])
                | Q(institution_id=obj.project.institution_id, role=Role.INSTITUTION_ADMIN)
            )
            .exists()
        )
    if action == "job.stop":
        role = _project_role(user, obj.project)
        if role is None:  # a submitter who has left the project no longer stops its jobs
            return False
        return obj.submitted_by_id == user.pk or role == ProjectRole.PRINCIPAL_INVESTIGATOR
    if action == "job.resume":  # the job's owner: its submitter, while still in the project
        return obj.submitted_by_id == user.pk and _project_role(user, obj.project) is not None
    if action == "institution.admin":
        return user.is_staff or _has_role(user, obj, Role.INSTITUTION_ADMIN)
    if action == "dataset.register":
        return _has_role(user, obj.institution, Role.DATA_STEWARD)
    if action == "access.decide":  # obj: a Dataset, or a Site
        site = getattr(obj, "site", obj)
        return _has_role(user, site.institution, Role.DATA_STEWARD)
    if action in {"price.manage", "pool.manage"}:
        return can(user, "institution.admin", obj.institution)
    if action == "invoice.view":
        return can(user, "institution.admin", getattr(obj, "institution", obj))
    if action in {"job.view_cost", "credit.view"}:
        if user.is_staff or _project_role(user, obj.project) is not None:
            return True
        involved = {
            obj.project.institution_id,
            *obj.sites.values_list("site__institution_id", flat=True),
        }
        return Membership.objects.filter(
            user=user, institution_id__in=involved, role=Role.INSTITUTION_ADMIN
        ).exists()
    if action in {"job.view_accounting", "job.retry_accounting"}:
        if user.is_staff:
            return True
        involved = {
            obj.project.institution_id,
            *obj.sites.values_list("site__institution_id", flat=True),
        }
        return Membership.objects.filter(
            user=user, institution_id__in=involved, role=Role.INSTITUTION_ADMIN
        ).exists()
    if action == "credit.edit":
        return _project_role(user, obj.project) == ProjectRole.PRINCIPAL_INVESTIGATOR
    if action == "ledger.view":  # leaves carry ids and figures only, no personal data
        return user.is_staff or Membership.objects.filter(user=user).exists()
    raise AssertionError(f"action {action!r} is listed in ACTIONS but not handled")

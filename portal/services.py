"""Writes of the portal core: audit events, institutions, memberships and projects."""

from __future__ import annotations

from django.db import transaction

from portal.models import AuditEvent, Institution, Membership, Project, ProjectMember, ProjectRole


def audit_record(
    *, by, action: str, target, institution: Institution | None = None, **data
) -> AuditEvent:
    """Append an audit event for ``target`` (any model instance). Call inside the writer's atomic."""
    return AuditEvent.objects.create(
        actor=by if getattr(by, "is_authenticated", False) else None,
        institution=institution,
        action=action,
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        data=data,
    )


@transaction.atomic
def membership_grant(*, by, user, institution: Institution, role: str) -> Membership:
    """Give ``user`` the ``role`` at ``institution`` (idempotent)."""
    membership, created = Membership.objects.get_or_create(
        user=user, institution=institution, role=role
    )
    if created:
        audit_record(
            by=by, action="membership.grant", target=membership, institution=institution, role=role
        )
    return membership


@transaction.atomic
def project_create(
    *, by, slug: str, title: str, institution: Institution, description: str = ""
) -> Project:
    """Create a project led by ``institution`` with ``by`` as principal investigator."""
    project = Project.objects.create(
        slug=slug, title=title, institution=institution, description=description
    )
    ProjectMember.objects.create(project=project, user=by, role=ProjectRole.PRINCIPAL_INVESTIGATOR)
    audit_record(by=by, action="project.create", target=project, institution=institution)
    return project


@transaction.atomic
def project_member_add(*, by, project: Project, user, role: str = ProjectRole.MEMBER):
    """Add ``user`` to ``project`` (idempotent). Invitations with accept/decline come with SSO."""
    member, created = ProjectMember.objects.get_or_create(
        project=project, user=user, defaults={"role": role}
    )
    if created:
        audit_record(
            by=by,
            action="project.member_add",
            target=project,
            institution=project.institution,
            user=user.username,
        )
    return member

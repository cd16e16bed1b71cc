"""Core models: institutions, memberships with roles, cross-institution projects, audit events."""

from django.conf import settings
from django.db import models


class Institution(models.Model):
    """A member organisation (university, hospital) with its own users, sites and data."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    email_domain = models.CharField(
        max_length=200, blank=True, help_text="Lets users find their institution at sign-in."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Role(models.TextChoices):
    RESEARCHER = "researcher", "Researcher"
    DATA_STEWARD = "data_steward", "Data steward"
    INSTITUTION_ADMIN = "institution_admin", "Institution admin"


class Membership(models.Model):
    """A user's role at an institution; a user may hold several roles there."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    institution = models.ForeignKey(
        Institution, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=32, choices=Role.choices, default=Role.RESEARCHER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "institution", "role"], name="membership_unique_role"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} — {self.get_role_display()} at {self.institution}"


class Project(models.Model):
    """A cross-institution collaboration; jobs and access grants belong to a project."""

    slug = models.SlugField(unique=True)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    institution = models.ForeignKey(
        Institution,
        on_delete=models.PROTECT,
        related_name="projects",
        help_text="The lead institution, which is invoiced for the project's compute.",
    )
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="ProjectMember", related_name="projects"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["title"]

    def __str__(self) -> str:
        return self.title


class ProjectRole(models.TextChoices):
    PRINCIPAL_INVESTIGATOR = "pi", "Principal investigator"
    MEMBER = "member", "Member"


class ProjectMember(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships"
    )
    role = models.CharField(max_length=16, choices=ProjectRole.choices, default=ProjectRole.MEMBER)
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="project_member_unique")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.get_role_display()})"


class AuditEvent(models.Model):
    """Who did what, when, to which object. Written by services in their own transaction."""

    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    institution = models.ForeignKey(
        Institution, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.target_type}:{self.target_id}"

"""Core models: institutions, their sites, memberships with roles, cross-institution projects,
audit events (and, in ``portal.ledger.models``, the ledger)."""

from django.conf import settings
from django.db import models


class Institution(models.Model):
    """A member organisation (university, hospital) with its own users, sites and data."""

    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)
    email_domain = models.CharField(
        max_length=200, blank=True, help_text="Lets users find their institution at sign-in."
    )
    require_mfa_for_staff = models.BooleanField(
        default=False,
        help_text="Institution admins and data stewards must use an authenticator app (TOTP).",
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


class Site(models.Model):
    """An institution's place in the federation: one Flower SuperNode beside that institution's
    data sandbox. Datasets (``sandbox``) and jobs (``federation``) live at sites; a site's compute
    pools belong to the federation (``federation.ComputePool.site``)."""

    institution = models.ForeignKey(Institution, on_delete=models.CASCADE, related_name="sites")
    slug = models.SlugField(unique=True, help_text="The site id the SuperNode reports.")
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(
        null=True, blank=True, help_text="When the site was revoked: its SuperNode is refused."
    )

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None


class SiteCredential(models.Model):
    """The credential a site's own tool authenticates with (``Authorization: Bearer …``): issued
    in the site kit, shown once, stored only as its SHA-256. Never a person's password. Issuing a
    new kit revokes the site's earlier credentials."""

    site = models.ForeignKey(Site, on_delete=models.CASCADE, related_name="credentials")
    token_sha256 = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="Shown to tell kits apart.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.site.slug} credential {self.prefix}…"


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
        # The institution's audit page reads a page of its newest events (issue 12).
        indexes = [
            models.Index(
                fields=["institution", "-created_at", "-id"], name="audit_institution_newest"
            )
        ]

    def __str__(self) -> str:
        return f"{self.created_at:%Y-%m-%d %H:%M} {self.actor} {self.action} {self.target_type}:{self.target_id}"


class IdPProtocol(models.TextChoices):
    OIDC = "oidc", "OpenID Connect"
    SAML = "saml", "SAML 2.0"


class IdentityProvider(models.Model):
    """An institution's single sign-on provider, configured by its admin on the portal's pages.

    Identity is (``provider_id``, subject): ``provider_id`` includes a hash of the issuer / entity id,
    so replacing an institution's IdP never lets the new IdP's subjects reach the old IdP's accounts.
    The portal keeps allauth's ``SocialApp`` in step (``portal.services.identity_provider_configure``).
    """

    institution = models.OneToOneField(
        Institution, on_delete=models.CASCADE, related_name="identity_provider"
    )
    protocol = models.CharField(max_length=8, choices=IdPProtocol.choices)
    enabled = models.BooleanField(default=True)
    provider_id = models.SlugField(max_length=80, unique=True, editable=False)
    display_name = models.CharField(max_length=200, blank=True)
    # OpenID Connect
    issuer = models.URLField(blank=True, help_text="Issuer URL (discovery at /.well-known/…).")
    client_id = models.CharField(max_length=255, blank=True)
    client_secret = models.TextField(
        blank=True, help_text="Sealed (portal.secretbox): fernet:<token> under FRP_FIELD_KEYS."
    )
    # SAML 2.0
    entity_id = models.CharField(max_length=255, blank=True)
    sso_url = models.URLField(blank=True, help_text="The IdP's SingleSignOnService (Redirect).")
    x509cert = models.TextField(blank=True, help_text="The IdP's signing certificate (PEM).")
    uid_attribute = models.CharField(max_length=255, blank=True)
    email_attribute = models.CharField(max_length=255, blank=True)
    social_app = models.OneToOneField(
        "socialaccount.SocialApp",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.get_protocol_display()} for {self.institution}"

    @property
    def login_path(self) -> str:
        """Where a sign-in with this IdP starts (POST)."""
        from django.urls import reverse

        if self.protocol == IdPProtocol.OIDC:
            return reverse("openid_connect_login", kwargs={"provider_id": self.provider_id})
        return reverse("saml_login", kwargs={"organization_slug": self.provider_id})

    def endpoints(self, request) -> dict[str, str]:
        """The absolute URLs the IdP must be told about (redirect URI, or ACS / entity id)."""
        from django.urls import reverse

        url = request.build_absolute_uri
        if self.protocol == IdPProtocol.OIDC:
            return {
                "Redirect (callback) URI": url(
                    reverse("openid_connect_callback", kwargs={"provider_id": self.provider_id})
                ),
            }
        kwargs = {"organization_slug": self.provider_id}
        return {
            "SP entity ID (metadata URL)": url(reverse("saml_metadata", kwargs=kwargs)),
            "Assertion Consumer Service (HTTP-POST)": url(reverse("saml_acs", kwargs=kwargs)),
            "Single Logout Service": url(reverse("saml_sls", kwargs=kwargs)),
        }


class InvitationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    ACCEPTED = "accepted", "Accepted"
    DECLINED = "declined", "Declined"
    REVOKED = "revoked", "Revoked"


def _invitation_token() -> str:
    import secrets

    return secrets.token_urlsafe(32)


class ProjectInvitation(models.Model):
    """An invitation to join a project, possibly from another institution, sent to an e-mail.

    Accepting needs a signed-in account whose e-mail matches (case-insensitively); the invitation
    expires at ``expires_at``.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=ProjectRole.choices, default=ProjectRole.MEMBER)
    token = models.CharField(max_length=64, unique=True, default=_invitation_token, editable=False)
    status = models.CharField(
        max_length=16, choices=InvitationStatus.choices, default=InvitationStatus.PENDING
    )
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    responded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    responded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                "project",
                models.functions.Lower("email"),
                condition=models.Q(status="pending"),
                name="invitation_one_pending_per_email",
            )
        ]

    def __str__(self) -> str:
        return f"{self.email} → {self.project} ({self.status})"

    def is_expired(self, at=None) -> bool:
        from django.utils import timezone

        return (at or timezone.now()) >= self.expires_at


# The ledger's rows live in portal.ledger.models; imported here so Django registers them in the core.
from portal.ledger.models import (  # noqa: E402, F401
    LedgerAppendOnlyError,
    LedgerCheckpoint,
    LedgerCosignature,
    LedgerEntry,
    LedgerWitness,
)

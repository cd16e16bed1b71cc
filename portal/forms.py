"""Forms of the portal core: IdP settings, member roles, SSO discovery by e-mail."""

from __future__ import annotations

from allauth.account.forms import ResetPasswordForm as AllauthResetPasswordForm
from django import forms

from portal.choice_fields import ModelChoiceField
from portal.models import IdPProtocol, ProjectRole, Role


class ResetPasswordForm(AllauthResetPasswordForm):
    """allauth's password-reset request, without the accounts that sign in only through their
    institution's single sign-on (a social account and no usable password): a reset would give
    such an account a local password and, with ``ACCOUNT_LOGIN_ON_PASSWORD_RESET``, sign it in
    past the IdP — a person the IdP removed, or its MFA (hostile re-test of issue 9, F6). Their
    addresses are treated as unknown (allauth's enumeration-safe path: no reset link is sent)."""

    def clean_email(self) -> str:
        from allauth.socialaccount.models import SocialAccount

        email = super().clean_email()
        sso_only = set(
            SocialAccount.objects.filter(user__in=[u.pk for u in self.users]).values_list(
                "user_id", flat=True
            )
        )
        self.users = [u for u in self.users if u.has_usable_password() or u.pk not in sso_only]
        return email


class SSODiscoverForm(forms.Form):
    email = forms.EmailField(
        label="Institutional e-mail",
        help_text="We send you to your institution's sign-in page; we do not store this address.",
    )


class IdentityProviderForm(forms.Form):
    """What an institution admin enters to connect their IdP (see README: Connecting an IdP)."""

    protocol = forms.ChoiceField(choices=IdPProtocol.choices, widget=forms.RadioSelect)
    enabled = forms.BooleanField(required=False, initial=True, help_text="Untick to pause SSO.")
    display_name = forms.CharField(
        required=False, max_length=200, help_text="Shown on the sign-in button (default: name)."
    )
    issuer = forms.URLField(
        assume_scheme="https",
        required=False,
        label="Issuer URL",
        help_text="OpenID Connect: the issuer; the portal reads <issuer>/.well-known/openid-configuration.",
    )
    client_id = forms.CharField(required=False, max_length=255, label="Client ID")
    client_secret = forms.CharField(
        required=False,
        max_length=255,
        label="Client secret",
        widget=forms.PasswordInput(render_value=False),
        help_text="Leave empty to keep the stored secret.",
    )
    entity_id = forms.CharField(
        required=False, max_length=255, label="IdP entity ID", help_text="SAML 2.0."
    )
    sso_url = forms.URLField(
        assume_scheme="https",
        required=False,
        label="IdP SSO URL",
        help_text="SingleSignOnService, HTTP-Redirect binding.",
    )
    x509cert = forms.CharField(
        required=False,
        label="IdP signing certificate",
        widget=forms.Textarea(attrs={"rows": 5}),
        help_text="PEM. Assertions must be signed with this certificate.",
    )
    uid_attribute = forms.CharField(
        required=False,
        max_length=255,
        label="Subject attribute",
        help_text="SAML attribute holding the stable user id (default: the NameID).",
    )
    email_attribute = forms.CharField(
        required=False, max_length=255, label="E-mail attribute", help_text="SAML attribute name."
    )
    require_mfa_for_staff = forms.BooleanField(
        required=False,
        label="Require an authenticator app (TOTP) for institution admins and data stewards",
    )


class MemberRolesForm(forms.Form):
    roles = forms.MultipleChoiceField(
        choices=Role.choices, required=False, widget=forms.CheckboxSelectMultiple
    )


class ProjectCreateForm(forms.Form):
    title = forms.CharField(max_length=200, help_text="What the collaboration studies.")
    institution = ModelChoiceField(
        queryset=None,
        label="Lead institution",
        help_text="Your institution that leads the project; it is invoiced for the project's compute.",
    )
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        from portal.models import Institution

        self.fields["institution"].queryset = Institution.objects.filter(
            memberships__user=user, memberships__role=Role.RESEARCHER
        ).distinct()


class InviteForm(forms.Form):
    email = forms.EmailField(help_text="The person's institutional e-mail; any institution.")
    role = forms.ChoiceField(choices=ProjectRole.choices, initial=ProjectRole.MEMBER)


class SiteAddForm(forms.Form):
    """An institution admin adds a site (its SuperNode host); the site kit comes next."""

    slug = forms.SlugField(
        label="Site id",
        max_length=50,
        help_text="Lower-case letters, digits and hyphens, e.g. hospital-c. Sites report it; it cannot change.",
    )
    name = forms.CharField(
        label="Name", max_length=200, required=False, help_text="Shown on pages."
    )

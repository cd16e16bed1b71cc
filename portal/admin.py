"""Django admin for the platform admin: institutions, sites, memberships, projects, users, audit
(read-only).

Two guards against 500s on bad input (issue 9, finding 7): autocomplete widgets drop submitted
values that are not valid keys before they query (Django's widget filters the related table with
them as they are, and a non-numeric id raises), and the user form refuses an e-mail address that
another account holds in another case (the database's case-insensitive unique index would raise).

``LargeTableMixin``: the change lists of the tables that grow with the jobs (jobs, accounting
steps, audit events, memberships, access requests) at a bounded cost per page (issue 12).
"""

from allauth.socialaccount.admin import SocialAppAdmin
from allauth.socialaccount.models import SocialApp
from django import forms
from django.contrib import admin
from django.contrib.admin import helpers, widgets
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import UserChangeForm
from django.core.exceptions import ValidationError
from django.utils.html import format_html
from django.utils.translation import gettext as _

from portal.models import AuditEvent, Institution, Membership, Project, ProjectMember, Site


class _SafeAutocompleteMixin:
    """``AutocompleteSelect`` that ignores submitted values the related key cannot hold."""

    def optgroups(self, name, value, attr=None):
        remote = self.field.remote_field
        key = remote.model._meta.get_field(getattr(remote, "field_name", None) or "pk")
        if key.name == "pk":
            key = remote.model._meta.pk
        clean = []
        for v in value:
            try:
                key.to_python(v)
            except (ValidationError, ValueError, TypeError):
                continue
            clean.append(v)
        return super().optgroups(name, clean, attr)


class SafeAutocompleteSelect(_SafeAutocompleteMixin, widgets.AutocompleteSelect):
    pass


class SafeAutocompleteSelectMultiple(_SafeAutocompleteMixin, widgets.AutocompleteSelectMultiple):
    pass


class SafeAutocompleteAdmin(admin.ModelAdmin):
    """A ``ModelAdmin`` whose ``autocomplete_fields`` use the safe widgets."""

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = SafeAutocompleteSelect(db_field, self.admin_site)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class SafeAutocompleteInline(admin.TabularInline):
    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name in self.get_autocomplete_fields(request):
            kwargs["widget"] = SafeAutocompleteSelect(db_field, self.admin_site)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class _DeferringChangeList(ChangeList):
    """The change list's rows without the columns in the admin's ``list_defer``."""

    def get_queryset(self, request, exclude_parameters=None):
        queryset = super().get_queryset(request, exclude_parameters)
        return (
            queryset.defer(*self.model_admin.list_defer)
            if self.model_admin.list_defer
            else queryset
        )


class LargeTableMixin:
    """For a ``ModelAdmin`` of a table with a row per job (or more): its change list costs the
    same at 10,000 jobs as at 10 (issue 12; ``benchmarks/pages.py``).

    Rendering the rows is most of a change list's time (Django's ``items_for_result``), so:
    ``list_per_page`` 50 (Django's default is 100; search, filters and the pages reach every row
    as before); the action checkbox written directly (``action_checkbox``: the same HTML as
    Django's ``CheckboxInput``, which renders a template per row); no second ``COUNT(*)`` over
    the whole table (``show_full_result_count``: a filtered list says "N results (Show all)"
    rather than "N results (M total)"); and ``list_defer``, the wide columns the list does not
    show (a job's ``final_metrics`` holds its model), left out of the list's query only (the
    change form reads the whole row).
    """

    list_per_page = 50
    show_full_result_count = False
    list_defer: tuple[str, ...] = ()

    def get_changelist(self, request, **kwargs):
        return _DeferringChangeList

    def action_checkbox(self, obj):
        """Django's checkbox column (``ModelAdmin.action_checkbox``), without a template."""
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            str(obj.pk),
            format_html(_("Select this object for an action - {}"), str(obj)),
        )


@admin.register(Institution)
class InstitutionAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "email_domain", "created_at"]
    search_fields = ["name", "slug", "email_domain"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "institution"]
    list_filter = ["institution"]
    search_fields = ["slug", "name"]


@admin.register(Membership)
class MembershipAdmin(LargeTableMixin, SafeAutocompleteAdmin):
    list_display = ["user", "institution", "role", "created_at"]
    list_select_related = ["user", "institution"]
    list_filter = ["role", "institution"]
    search_fields = ["user__username", "user__email"]
    autocomplete_fields = ["user", "institution"]


class ProjectMemberInline(SafeAutocompleteInline):
    model = ProjectMember
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["title", "slug", "institution", "created_at"]
    search_fields = ["title", "slug"]
    list_filter = ["institution"]
    inlines = [ProjectMemberInline]


@admin.register(AuditEvent)
class AuditEventAdmin(LargeTableMixin, admin.ModelAdmin):
    list_display = ["created_at", "actor", "institution", "action", "target_type", "target_id"]
    list_filter = ["action", "institution"]
    list_select_related = ["actor", "institution"]  # nullable keys: not joined by default
    list_defer = ("data",)
    search_fields = ["action", "target_id", "actor__username"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class _UsernameWithoutCase:
    """Usernames are unique regardless of case, as allauth's sign-up and sign-in compare them:
    two accounts "ada" and "Ada" made sign-in by username ambiguous (issue 9, hostile re-test C;
    Django's change form checks with case, its creation form without)."""

    def clean_username(self):
        username = self.cleaned_data.get("username")
        if username:
            others = get_user_model().objects.filter(username__iexact=username)
            if self.instance.pk:
                others = others.exclude(pk=self.instance.pk)
            if others.exists():
                raise forms.ValidationError(
                    "Another account already uses this username (compared without case)."
                )
        return username


class PortalUserChangeForm(_UsernameWithoutCase, UserChangeForm):
    """The admin's user form: usernames and e-mail addresses are unique regardless of case."""

    def clean_email(self):
        email = (self.cleaned_data.get("email") or "").strip()
        if email:
            others = (
                get_user_model().objects.filter(email__iexact=email).exclude(pk=self.instance.pk)
            )
            if others.exists():
                raise forms.ValidationError(
                    "Another account already uses this e-mail address (compared without case)."
                )
        return email


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class PortalUserAdmin(UserAdmin):
    form = PortalUserChangeForm  # (Django's creation form already compares without case)


# allauth's SocialApp rows are kept in step by the institution's Single sign-on page; their
# client secrets live sealed on the IdentityProvider (portal.secretbox), never in this form.
admin.site.unregister(SocialApp)


@admin.register(SocialApp)
class PortalSocialAppAdmin(SocialAppAdmin):
    readonly_fields = ("secret",)

"""URLs of the portal core: dashboard, SSO discovery, institution admin pages."""

from django.urls import path

from portal.views import dashboard, institution, sso

app_name = "portal"
urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("sso/discover/", sso.sso_discover, name="sso_discover"),
    path("institutions/<slug:slug>/members/", institution.members, name="institution_members"),
    path(
        "institutions/<slug:slug>/members/<int:user_id>/roles/",
        institution.member_roles,
        name="institution_member_roles",
    ),
    path(
        "institutions/<slug:slug>/members/<int:user_id>/deactivate/",
        institution.member_deactivate,
        name="institution_member_deactivate",
    ),
    path(
        "institutions/<slug:slug>/identity-provider/",
        institution.identity_provider,
        name="institution_idp",
    ),
    path("institutions/<slug:slug>/sites/", institution.sites, name="institution_sites"),
    path("institutions/<slug:slug>/audit/", institution.audit, name="institution_audit"),
]

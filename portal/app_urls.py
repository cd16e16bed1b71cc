"""URLs of the portal core: dashboard, SSO discovery, projects, institution admin pages, the ledger."""

from django.urls import include, path

from portal.views import dashboard, institution, projects, sso

app_name = "portal"
urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("sso/discover/", sso.sso_discover, name="sso_discover"),
    path("projects/", projects.project_list, name="project_list"),
    path("projects/new/", projects.project_create, name="project_create"),
    path("projects/<slug:slug>/", projects.project_detail, name="project_detail"),
    path("projects/<slug:slug>/invite/", projects.project_invite, name="project_invite"),
    path(
        "projects/<slug:slug>/members/<int:user_id>/role/",
        projects.project_member_role,
        name="project_member_role",
    ),
    path("invitations/<str:token>/", projects.invitation_respond, name="invitation_respond"),
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
    path(
        "institutions/<slug:slug>/sites/<slug:site_slug>/revoke/",
        institution.site_revoke,
        name="institution_site_revoke",
    ),
    path("institutions/<slug:slug>/audit/", institution.audit, name="institution_audit"),
    path("ledger/", include("portal.ledger.urls")),
]

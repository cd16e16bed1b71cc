"""Root URL configuration."""

from django.contrib import admin
from django.urls import include, path

from portal.views import sso

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", sso.login, name="account_login"),  # allauth's, with SSO choices
    path("accounts/", include("allauth.urls")),
    path("jobs/", include("federation.urls")),
    path("accounting/", include("accounting.urls")),
    path("", include("federation.site_urls")),
    path("", include("sandbox.urls")),
    path("", include("portal.app_urls")),
]

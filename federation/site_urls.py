"""URLs of onboarding by site kit: the admins' SuperNode panel and kit, and the sites' own API
(mounted at ``/api/site/v1/`` and ``/sites/`` by the root URLconf)."""

from django.urls import path

from federation import site_views

app_name = "sites"
urlpatterns = [
    path("sites/<slug:slug>/supernode/", site_views.site_node_state, name="node_state"),
    path("sites/<slug:slug>/kit/", site_views.site_kit_download, name="kit"),
    path("sites/<slug:slug>/supernode-key/", site_views.site_node_key_upload, name="key_upload"),
    path("api/site/v1/supernode-key", site_views.api_supernode_key, name="api_supernode_key"),
    path("api/site/v1/status", site_views.api_status, name="api_status"),
]

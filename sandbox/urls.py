"""URLs of the sandbox: dataset catalogue, access requests, the steward's queue."""

from django.urls import path

from sandbox import site_api, views

app_name = "sandbox"
urlpatterns = [
    path("datasets/", views.dataset_list, name="dataset_list"),
    path("datasets/upload/", views.dataset_upload, name="dataset_upload"),
    path("datasets/<int:pk>/", views.dataset_detail, name="dataset_detail"),
    path("datasets/<int:pk>/rules/", views.dataset_rules, name="dataset_rules"),
    path("access-requests/", views.steward_queue, name="steward_queue"),
    path("access-requests/<int:pk>/decide/", views.request_decide, name="request_decide"),
    path("access-requests/<int:pk>/revoke/", views.grant_revoke, name="grant_revoke"),
    path(
        "access-requests/<int:pk>/privacy-budget/",
        views.privacy_budget_set,
        name="privacy_budget_set",
    ),
    # The sites' own API (frp-site ingest / key rotate), authenticated by the site credential.
    path(
        "api/site/v1/datasets/<str:slug>/next-version",
        site_api.next_version,
        name="api_next_version",
    ),
    path("api/site/v1/datasets", site_api.datasets, name="api_datasets"),
    path(
        "api/site/v1/versions/<int:pk>/object", site_api.version_object, name="api_version_object"
    ),
]

"""URLs of federated jobs and the ServerApp callback."""

from django.urls import path

from federation import pool_views, views

app_name = "federation"
urlpatterns = [
    path("", views.job_list, name="job_list"),
    path("new/", views.job_create, name="job_create"),
    path("new/estimate/", views.job_estimate, name="job_estimate"),
    path("new/columns/", views.job_columns, name="job_columns"),
    path("new/privacy/", views.job_privacy, name="job_privacy"),
    path("<int:pk>/", views.job_detail, name="job_detail"),
    path("<int:pk>/progress/", views.job_progress, name="job_progress"),
    path("<int:pk>/progress.json", views.job_progress_json, name="job_progress_json"),
    path("<int:pk>/stop/", views.job_stop, name="job_stop"),
    path("<int:pk>/release/", views.job_release_request, name="job_release_request"),
    path("<int:pk>/model.json", views.job_model_download, name="job_model_download"),
    path("<int:pk>/model.skops", views.job_model_skops, name="job_model_skops"),
    path("<int:pk>/model-card/", views.job_model_card, name="job_model_card"),
    path("<int:pk>/resume/", views.job_resume, name="job_resume"),
    path("callback/<int:pk>/", views.job_callback, name="job_callback"),
    path("releases/<int:pk>/decide/", views.release_decide, name="release_decide"),
    path("sites/<int:site_pk>/pools/new/", pool_views.pool_create, name="pool_create"),
    path("pools/<int:pk>/", pool_views.pool_edit, name="pool_edit"),
    path("pools/<int:pk>/carbon/", pool_views.pool_carbon_upload, name="pool_carbon_upload"),
    path("pools/<int:pk>/read/", pool_views.pool_read, name="pool_read"),
    path("pools/<int:pk>/queue/", pool_views.pool_queue, name="pool_queue"),
    path("pools/<int:pk>/calendar/", pool_views.pool_calendar, name="pool_calendar"),
    path("pools/<int:pk>/calendar.json", pool_views.pool_calendar_json, name="pool_calendar_json"),
    path("supernodes/", views.supernodes, name="supernodes"),
]

"""URLs of the portal core (dashboard)."""

from django.urls import path

from portal import views

app_name = "portal"
urlpatterns = [
    path("", views.dashboard, name="dashboard"),
]

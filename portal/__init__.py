"""The portal's Django project and shared core: institutions, memberships, projects, audit."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]

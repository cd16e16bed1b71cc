"""The portal's Django project and shared core: institutions, sites, memberships, projects,
audit, the ledger."""

from portal.celery import app as celery_app

__all__ = ["celery_app"]

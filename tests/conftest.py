"""Shared fixtures. Settings (PostgreSQL and Redis by default) live in ``tests/settings.py``.

Unit tests run Celery tasks eagerly (the ``eager_celery`` fixture); integration tests start a real
worker (tests/federation/conftest.py).
"""

from __future__ import annotations

import pytest

pytest_plugins = ["tests.idp.fixtures"]  # the real OIDC and SAML IdPs


@pytest.fixture
def eager_celery(settings):
    """Run Celery tasks in-process (unit tests only)."""
    from portal.celery import app

    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture(scope="session", autouse=True)
def _end_stray_database_sessions(django_db_setup, django_db_blocker):
    """Before the test database is dropped, end sessions other threads left open (live server)."""
    yield
    from django.db import DatabaseError, connection

    if connection.vendor != "postgresql" or not connection.settings_dict["NAME"].startswith(
        "test_"
    ):
        return
    try:
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
    except DatabaseError:
        pass  # nothing to end: the database is already gone

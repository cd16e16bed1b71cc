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


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with an empty cache of its own run.

    allauth counts sign-ins per client address in the cache (``login: 30/m/ip``): every test
    client is 127.0.0.1, so without this a test's sign-in is refused once the tests before it
    in the same minute have signed in 30 times — a failure that depends on the machine's speed.
    Only this run's keys (``KEY_PREFIX``) are dropped; other runs share the Redis server.
    """
    from django.core.cache import cache

    backend = type(cache).__name__
    if backend == "RedisCache":
        client = cache._cache.get_client(write=True)
        keys = list(client.scan_iter(match=f"{cache.key_prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    else:
        cache.clear()
    yield


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

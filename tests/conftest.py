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

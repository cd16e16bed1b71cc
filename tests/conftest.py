"""Shared fixtures. Settings (PostgreSQL and Redis by default) live in ``tests/settings.py``.

Unit tests run Celery tasks eagerly (the ``eager_celery`` fixture); integration tests start a real
worker (tests/federation/conftest.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.idp.fixtures"]  # the real OIDC and SAML IdPs

#: The PostgreSQL triggers that refuse TRUNCATE on the ledger (portal migration 0007).
_NO_TRUNCATE = ("portal_ledgerentry", "portal_ledgercheckpoint")


def _flush_past_the_ledger_guard() -> None:
    """Let the test flush (between transactional tests) truncate the ledger tables.

    Django's flush is one ``TRUNCATE`` of every table; the ledger refuses TRUNCATE (issue 9,
    finding 10b). The flush disables those triggers for its own statement, in its own
    transaction, as the tables' owner (the tests' role); nothing else in the suite can.
    """
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, **kwargs):
        statements = original(self, style, tables, **kwargs)
        guarded = [t for t in _NO_TRUNCATE if t in tables]
        if not statements or not guarded:
            return statements
        off = [f"ALTER TABLE {t} DISABLE TRIGGER {t}_no_truncate;" for t in guarded]
        on = [f"ALTER TABLE {t} ENABLE ALWAYS TRIGGER {t}_no_truncate;" for t in guarded]
        return off + statements + on

    DatabaseOperations.sql_flush = sql_flush


_flush_past_the_ledger_guard()


def _flush_retried_on_deadlock(attempts: int = 5) -> None:
    """Retry the test flush when PostgreSQL picks it as a deadlock's victim.

    An integration module's Celery worker and beat (a real concurrent process, reconciling every
    second) stay up across its tests, so the flush between two tests — one ``TRUNCATE`` of every
    table — can deadlock with a worker transaction that holds one table and wants another
    (``DeadlockDetected``). PostgreSQL aborts one of the two; when it is the flush, its
    transaction is rolled back whole (the outermost ``atomic``), so trying it again is clean.
    """
    from django.db import OperationalError
    from django.db.backends.postgresql.operations import DatabaseOperations

    original = DatabaseOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):
        for attempt in range(attempts):
            try:
                original(self, sql_list)
            except OperationalError as exc:
                deadlock = getattr(exc.__cause__, "sqlstate", None) == "40P01"
                if not deadlock or attempt == attempts - 1:
                    raise
            else:
                _empty_the_model_store()
                return

    DatabaseOperations.execute_sql_flush = execute_sql_flush


_flush_retried_on_deadlock()


def _empty_the_model_store() -> None:
    """Empty this run's model store (``FRP_MODEL_STORE_URL``, a folder of tests/settings.py) with
    the database it belongs to.

    A federation module's teardown runs the ``flush`` command, which restarts the id sequences
    (``TRUNCATE … RESTART IDENTITY``), so the next module's job 2 is a new job 2 — and the store,
    keyed by job id, handed it the round checkpoints and final model of the last module's job 2:
    the ServerApp fault test saw a round-2 checkpoint the moment its job was submitted and killed
    the previous job's exiting ServerApp (its superlink.log: the new run's own task finished
    normally). Emptied at every flush, the store holds what the database knows of, no more.
    """
    import shutil
    from pathlib import Path
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("FRP_MODEL_STORE_URL", ""))
    if url.scheme != "file" or "frp-test-models-" not in url.path:
        return  # not a store tests/settings.py made for this run: never emptied
    root = Path(url.path)
    for child in root.iterdir() if root.is_dir() else ():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, hand out the files with slow tests first (longest-processing-time first).

    ``scripts/test.sh`` runs files in three processes (``--dist loadfile``) and turns off xdist's
    own order (files with the most tests first, ``--no-loadscope-reorder``), which started the
    real-federation modules, a few tests each and most of the run's time, last: three of them at
    once at the end, with the quick files already done. Slow files first lets the quick ones fill
    the processes' gaps while the federations wait. Among the slow files the longest go first
    (``tests/durations.json``: seconds per file, measured in a CI run; a slow file not listed
    counts as the listed median), so that the longest module does not start last and run alone
    at the end (longest-processing-time first). A stable sort, after pytest-django's own (which
    puts transactional tests last): the order within each file is unchanged. Without xdist
    (``FRP_TEST_WORKERS=0``) the order is pytest-django's.
    """
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    root = Path(__file__).resolve().parent.parent
    measured = json.loads(Path(__file__).with_name("durations.json").read_text())
    seconds = {root / name: float(s) for name, s in measured.items()}
    listed = sorted(seconds.values())
    median = listed[len(listed) // 2] if listed else 0.0

    def order(item) -> tuple[bool, float]:
        if item.path not in slow_files:
            return (True, 0.0)
        return (False, -seconds.get(item.path, median))

    items.sort(key=order)


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

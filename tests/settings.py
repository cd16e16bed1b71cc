"""Settings for the test suite: the portal's settings with real services as defaults.

PostgreSQL on 127.0.0.1:5432 and Redis db 15 on 127.0.0.1:6379 unless ``DATABASE_URL`` /
``CELERY_BROKER_URL`` say otherwise. Loaded by pytest-django (see ``pyproject.toml``).
"""

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/frp")
os.environ.setdefault("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
# pytest-xdist (scripts/test.sh runs the suite with -n): worker gwN gets Redis db (the URL's db − N),
# as its federation fixtures flush their broker's db and its Celery workers must not take another
# worker's tasks; the test database is per process already (below).
_XDIST = os.environ.get("PYTEST_XDIST_WORKER", "")
if _XDIST.startswith("gw") and not os.environ.get("_FRP_XDIST_BROKER_SET"):
    _base, _, _db = os.environ["CELERY_BROKER_URL"].rpartition("/")
    _n = int(_XDIST[2:])
    if not _db.isdigit() or int(_db) < _n:
        raise RuntimeError(
            f"CELERY_BROKER_URL must end in a Redis db number of at least {_n} for xdist worker "
            f"{_XDIST} (it uses db − {_n})"
        )
    os.environ["CELERY_BROKER_URL"] = f"{_base}/{int(_db) - _n}"
    os.environ["_FRP_XDIST_BROKER_SET"] = "1"  # once per process, however often settings load
# Tests point every store, queue and federation at their own temporary folders; this one is only
# the settings' default and is shared by runs rather than created anew at every settings load.
os.environ.setdefault(
    "FRP_VAR_DIR",
    os.path.join(tempfile.gettempdir(), f"frp-test-var{'-' + _XDIST if _XDIST else ''}"),
)

# The model store (round checkpoints, final models) is keyed by job id, and job ids repeat: each
# test run's database counts from 1, and so it does again after a federation module's flush
# (tests/conftest.py empties the store then), so a shared store hands a new job 2 the round
# checkpoints of an earlier job 2. One store per run (and per xdist worker), named in the
# environment so the worker, SuperLink and ServerApps this process starts use the same one.
if _XDIST:
    _models = f"frp-test-models-{os.environ.get('PYTEST_XDIST_TESTRUNUID', 'run')}-{_XDIST}"
    os.environ["FRP_MODEL_STORE_URL"] = Path(tempfile.gettempdir(), _models).as_uri()
    if "pytest" in sys.modules:  # the xdist worker itself, not a worker or SuperLink it starts
        atexit.register(shutil.rmtree, Path(tempfile.gettempdir(), _models), ignore_errors=True)
elif "FRP_MODEL_STORE_URL" not in os.environ:
    _models = tempfile.mkdtemp(prefix="frp-test-models-")
    os.environ["FRP_MODEL_STORE_URL"] = Path(_models).as_uri()
    atexit.register(shutil.rmtree, _models, ignore_errors=True)

from portal.settings import *  # noqa: E402,F403

# One test database per pytest process, so concurrent runs (developers, helpers, CI) never collide.
DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}  # noqa: F405

# The tests' IdPs listen on loopback addresses (127.0.0.2, .3 …): the OIDC guard's allow-list.
FRP_OIDC_ALLOWED_HOSTS = ["127.0.0.0/8"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast hashing in tests only
# The Redis cache (as in deployments), with keys of this run only: no rate-limit count leaks
# from one test run into the next.
CACHES["default"]["KEY_PREFIX"] = f"frp-test-{os.getpid()}"  # noqa: F405

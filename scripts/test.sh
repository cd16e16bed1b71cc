#!/usr/bin/env bash
# The README's second command: the whole test suite, lint and migration checks included.
#
#   scripts/test.sh            everything (unit + integration with PostgreSQL, Redis, a Celery worker,
#                              a real Flower SuperLink/SuperNodes and an S3 server)
#   scripts/test.sh -m "not integration"   pass extra arguments to pytest
#
# Needs PostgreSQL on 127.0.0.1:5432 (trust auth) and Redis on 127.0.0.1:6379, Debian's chromium,
# simplesamlphp and php-cli; .ci/run installs and starts those on a machine that lacks them.
# Override the services with DATABASE_URL / CELERY_BROKER_URL.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install --quiet -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true

if [ ! -d tests/idp/node_modules ]; then
  echo "==> npm packages for the test OIDC providers"
  npm ci --prefix tests/idp --no-audit --no-fund --loglevel=error
fi

echo "==> ruff"
.venv/bin/ruff format --check .
.venv/bin/ruff check .
echo "==> migrations are up to date"
DATABASE_URL=sqlite://:memory: DJANGO_SETTINGS_MODULE=tests.settings \
  .venv/bin/python manage.py makemigrations --check --dry-run
echo "==> pytest"
# Test files spread over three processes (pytest-xdist; a file's tests stay in one process, so a
# module's federation starts once): about 0.6x the wall time of one process on this 2-core
# machine (docs/adr/0029-parallel-test-files.md). FRP_TEST_WORKERS=0 runs them in one process.
# Files with slow tests are handed out first (tests/conftest.py), not xdist's most-tests-first.
exec .venv/bin/python -m pytest -n "${FRP_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"

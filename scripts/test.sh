#!/usr/bin/env bash
# The README's second command: the whole test suite, lint and migration checks included.
#
#   scripts/test.sh            everything (unit + integration with PostgreSQL, Redis, a Celery worker,
#                              a real Flower SuperLink/SuperNodes and an S3 server)
#   scripts/test.sh -m "not integration"   pass extra arguments to pytest
#
# Needs PostgreSQL on 127.0.0.1:5432 (trust auth) and Redis on 127.0.0.1:6379; .ci/run starts them
# on a machine where they are not running. Override with DATABASE_URL / CELERY_BROKER_URL.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install --quiet -e '.[test]' 2>&1 | grep -v "^WARNING: Location" || true

echo "==> ruff"
.venv/bin/ruff format --check .
.venv/bin/ruff check .
echo "==> migrations are up to date"
DJANGO_SETTINGS_MODULE=tests.settings .venv/bin/python manage.py makemigrations --check --dry-run
echo "==> pytest"
exec .venv/bin/python -m pytest "$@"

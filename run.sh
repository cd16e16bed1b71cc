#!/usr/bin/env bash
# The README's first command: from a fresh clone to a finished federated job, portal left serving.
#
#   ./run.sh                  install, migrate, seed, start the federation + worker + web, run the demo
#                             job by web form, then keep serving http://127.0.0.1:${FRP_PORT:-8000}
#   ./run.sh --exit-after-job same, then stop everything and exit with the job's status (for scripts)
#   FRP_PORT=8100 ./run.sh    serve on another port (default 8000)
#   FRP_VAR_DIR=/tmp/frp ./run.sh   keep database, keys, stores and logs elsewhere (default ./var)
#
# Embedded default: SQLite, Celery over the filesystem transport, one store directory per site, all
# under ./var. Nothing here needs a server to be installed.
set -euo pipefail
cd "$(dirname "$0")"
# Everything under ./var (database, keys, mail, logs, the SuperLink's database) is ours alone.
umask 077

EXIT_AFTER_JOB=0
for arg in "$@"; do
  case "$arg" in
    --exit-after-job) EXIT_AFTER_JOB=1 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
PORT=${FRP_PORT:-8000}
VAR=${FRP_VAR_DIR:-var}  # the portal's own default (settings.VAR_DIR); FRP_VAR_DIR moves all of it
export FRP_CALLBACK_BASE_URL="http://127.0.0.1:${PORT}"
export PYTHONUNBUFFERED=1
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
t0=$(date +%s)

step "Installing into .venv (Python: $($PYTHON --version); log: $VAR/logs/install.log)"
mkdir -p "$VAR/logs"
# Progress, not minutes of silence: one line per package pip fetches or builds; the full log is kept;
# and a line every 20 s while the venv is created or pip is quiet (unpacking a few hundred MB).
( while sleep 20; do echo "    ... still installing ($(( $(date +%s) - t0 )) s)"; done ) &
ticker=$!
if [ ! -x .venv/bin/python ]; then
  echo "    creating the virtual environment .venv"
  "$PYTHON" -m venv .venv || { kill "$ticker"; echo "could not create .venv with $PYTHON" >&2; exit 1; }
fi
if ! { .venv/bin/python -m pip install --upgrade pip && .venv/bin/python -m pip install -e .; } 2>&1 \
    | tee "$VAR/logs/install.log" \
    | { grep --line-buffered -E '^(Collecting|Building|Installing collected|Successfully installed)' \
        | sed -u -E 's/^(.{0,110}).*/    \1/' || true; }; then
  kill "$ticker" 2>/dev/null
  tail -n 30 "$VAR/logs/install.log" >&2; echo "install failed ($VAR/logs/install.log)" >&2; exit 1
fi
kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
PY=.venv/bin/python

step "Preparing the database (SQLite under $VAR, unless DATABASE_URL names another) and the demo institutions"
$PY manage.py migrate --noinput -v0
$PY manage.py demo_seed

PIDS=()
cleanup() {
  trap - INT TERM
  echo "Stopping the portal, the Celery worker and the local federation ..."
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  # Celery's warm shutdown lets a running task finish: wait up to 30 s, then end it.
  for i in $(seq 1 150); do
    alive=()
    for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    [ "${#alive[@]}" = 0 ] && break
    if [ $((i % 25)) = 0 ]; then  # every 5 s: who is still finishing, so the wait is not silent
      echo "  ... still stopping after $((i / 5)) s (at most 30 s): $(ps -o comm= -p "$(IFS=,; echo "${alive[*]}")" | sort -u | tr '\n' ' ')"
    fi
    sleep 0.2
  done
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true; done
  $PY manage.py federation_down >/dev/null 2>&1 || true
  echo "Stopped."
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "Starting the local federation: a Flower SuperLink and one SuperNode per site"
$PY manage.py federation_up

broker="filesystem broker"; [ -n "${CELERY_BROKER_URL:-}" ] && broker="the broker of CELERY_BROKER_URL"
step "Starting the Celery worker ($broker) and the portal on 127.0.0.1:${PORT}"
.venv/bin/celery -A portal worker -B --concurrency 1 --loglevel INFO \
  --schedule "$VAR/celerybeat-schedule" >"$VAR/logs/worker.log" 2>&1 &
PIDS+=($!)
$PY manage.py serve --bind "127.0.0.1:${PORT}" >"$VAR/logs/web.log" 2>&1 &
web=$!
PIDS+=($web)
ready=0
for _ in $(seq 1 300); do
  if ! kill -0 "$web" 2>/dev/null; then
    echo "The portal's web server exited before it answered; the end of $VAR/logs/web.log:" >&2
    tail -n 20 "$VAR/logs/web.log" >&2
    exit 1
  fi
  $PY - <<PYEOF 2>/dev/null && { ready=1; break; }
import urllib.request; urllib.request.urlopen("http://127.0.0.1:${PORT}/accounts/login/", timeout=1)
PYEOF
  sleep 0.2
done
if [ "$ready" != 1 ]; then
  echo "The portal did not answer on 127.0.0.1:${PORT} after 300 tries; see $VAR/logs/web.log" >&2
  exit 1
fi

step "Submitting the demo job through the web form, as researcher 'ada'"
status=0
$PY manage.py demo_job --base-url "http://127.0.0.1:${PORT}" || status=$?
echo "Total time of this command: $(( $(date +%s) - t0 )) s"

if [ "$EXIT_AFTER_JOB" = 1 ]; then
  exit "$status"
fi
step "Portal serving at http://127.0.0.1:${PORT}/ — sign in as ada / federated-demo-2026 (Ctrl-C stops everything)"
echo "Logs: $VAR/logs/ (web, worker) and $VAR/federation/logs/ (SuperLink, SuperNodes)"
wait

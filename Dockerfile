# One image for every part of the Federated Research Portal that runs our code: the web server
# (gunicorn), the Celery worker, beat and Flower (ops UI), the Flower SuperLink (whose ServerApp
# signs callbacks with the key in its environment, ADR 0013) and each site's Flower SuperNode (whose
# ClientApp imports the sandbox loader). See docker-compose.yml and docs/deployment.md.
#
#   docker build -t federated-research-portal:latest .
FROM python:3.11-slim-bookworm

# PYTHONPATH: settings.BASE_DIR is the parent of the imported `portal` package, and templates/ and
# federation/flwr_app/ (the Flower App that `flwr run` builds) are not package data, so the source
# tree in /app is imported first; `pip install .` provides the pinned dependencies (flwr==1.42.0 …)
# and the console scripts (celery, flwr, flower-superlink, flower-supernode, …).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=portal.settings \
    FRP_VAR_DIR=/var/lib/frp \
    FLWR_TELEMETRY_ENABLED=0 \
    PYTHONPATH=/app

# A fixed uid, so operators can `chown 10001` the key files that compose mounts (bind-mounted secrets
# keep the host's owner and mode; see docs/deployment.md).
RUN groupadd --system --gid 10001 frp \
    && useradd --system --uid 10001 --gid frp --home-dir /var/lib/frp --shell /usr/sbin/nologin frp

WORKDIR /app
COPY . /app
RUN pip install . \
    && rm -rf build ./*.egg-info \
    # Fail the build, not the first request: settings import, app registry and system checks.
    && python manage.py check \
    # Static files into the image, so the `static` volume starts filled (web refreshes it on start).
    && python manage.py collectstatic --noinput --verbosity 0 \
    # python3-saml (allauth's SAML provider) needs lxml and xmlsec built on the same libxml2.
    && python -c "import importlib.util as u; u.find_spec('xmlsec') is None or __import__('xmlsec')" \
    # Writable state: static files (a volume shared with the proxy), the flwr CLI home, the
    # SuperLink/SuperNode homes (volumes), and the keyring mount point of a site's SuperNode.
    && mkdir -p /var/lib/frp/static /var/lib/frp/flwr-control /var/lib/flwr /keys \
    && chown -R frp:frp /var/lib/frp /var/lib/flwr \
    && chmod 0700 /keys && chown frp:frp /keys

USER frp
EXPOSE 8000
# gunicorn takes its worker count from WEB_CONCURRENCY.
ENV WEB_CONCURRENCY=3
CMD ["gunicorn", "portal.wsgi:application", "--bind", "0.0.0.0:8000", "--timeout", "60", \
     "--access-logfile", "-", "--logger-class", "portal.logredact.GunicornLogger"]

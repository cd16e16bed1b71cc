"""``manage.py serve``: the embedded default's web server (``run.sh`` starts it).

gunicorn, one process of threads (the embedded default's cache, which holds the sign-in rate
limits, is per process), with the redacting access log of the compose image, and no keep-alive:
a request that is answered without its body being read (a body larger than the portal accepts,
``portal.middleware.BodyLimitMiddleware``) closes its connection instead of the server reading
the rest to find the next request. Django's development server, which ``run.sh`` used before,
read every unread body into memory at the end of its request: an anonymous 1.5 GB POST grew it
by 1.1 GB and held it (issue 9, hostile re-test A). The worker is gunicorn's ``gthread`` with a
deadline on each request's headers (``portal.embedded_server``, ``FRP_HEADER_TIMEOUT``): slow
clients cannot hold its threads (slowloris).
"""

from __future__ import annotations

import os
import shutil
import sys

from django.core.management.base import BaseCommand, CommandError


def gunicorn_argv(bind: str, *, threads: int = 8) -> list[str]:
    """The gunicorn command line of the embedded default, bound to ``bind`` (``host:port``, or
    ``fd://N`` for a socket the caller holds). Raises ``CommandError`` without gunicorn."""
    exe = shutil.which("gunicorn", path=os.path.dirname(sys.executable)) or shutil.which("gunicorn")
    if exe is None:
        raise CommandError("gunicorn is not installed: run ./run.sh, or pip install -e . again")
    return [
        exe,
        "portal.embedded_wsgi:application",
        "--bind",
        bind,
        "--workers",
        "1",
        "--worker-class",
        "portal.embedded_server.HeaderDeadlineWorker",  # gthread, headers within a deadline
        "--threads",
        str(threads),
        "--keep-alive",
        "0",
        "--no-control-socket",  # gunicorn's one shared path (~/.gunicorn): two portals would clash
        "--timeout",
        "120",
        "--graceful-timeout",
        "10",
        "--access-logfile",
        "-",
        "--logger-class",
        "portal.logredact.GunicornLogger",
    ]


class Command(BaseCommand):
    help = "Serve the portal (the embedded default's web server: gunicorn, static files included)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--bind", default="127.0.0.1:8000", help="host:port, or fd://N (a held socket)"
        )

    def handle(self, *args, **options):
        argv = gunicorn_argv(options["bind"])
        sys.stdout.flush()
        os.execv(argv[0], argv)  # noqa: S606 (gunicorn takes this process: run.sh stops it)

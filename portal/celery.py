"""The Celery application; tasks live in each app's ``tasks.py``.

A worker started with ``-B`` runs beat as a child process (``celery.beat.EmbeddedService``). If the
worker is killed outright (SIGKILL, OOM killer) that child would live on and keep queueing periodic
tasks with no worker to run them; ``_die_with_worker`` ends it with its parent: on Linux the kernel
sends it SIGTERM when the worker dies (``prctl(PR_SET_PDEATHSIG)``), and a watchdog thread checks
the parent's pid every second as a fallback elsewhere.
"""

import contextlib
import ctypes
import os
import signal
import sys
import threading

from celery import Celery
from celery.signals import beat_embedded_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

_PR_SET_PDEATHSIG = 1


@beat_embedded_init.connect
def _die_with_worker(sender=None, **kwargs) -> None:
    """In the embedded beat process: end when the worker that started it is gone."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent or parent == 1:  # the worker died before we could ask
        os._exit(0)

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="beat-parent-watch", daemon=True).start()

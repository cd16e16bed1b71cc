"""Boundary to the embedded default's message broker: kombu's filesystem transport, made atomic.

kombu 5.x ``filesystem.Channel._put`` creates ``<ms>_<uuid>.<queue>.msg`` and only then locks and
writes it, while ``_get`` moves and reads files without taking the lock, so a consumer can read an
empty message and the Celery worker dies (``JSONDecodeError``; reproduced: 10 of 2,000 messages). This
transport writes ``….msg.part`` and renames it with ``os.replace`` (atomic within one directory);
``_get`` only picks names ending in ``<queue>.msg``. Selected by ``CELERY_BROKER_TRANSPORT`` in
settings when ``CELERY_BROKER_URL`` is ``filesystem://``. Servers (Redis) need none of this.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    """A filesystem channel whose messages appear in the queue folder only when complete."""

    def _put(self, queue, payload, **kwargs):
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = final + ".part"
        try:
            with open(partial, "wb") as fh:
                fh.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel

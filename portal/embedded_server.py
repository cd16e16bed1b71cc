"""gunicorn's threaded worker for the embedded default (``manage.py serve``), with a deadline on
a request's headers.

gunicorn's ``gthread`` worker hands a connection to one of its threads as soon as its first
bytes arrive, and the thread then reads the request line and headers with blocking reads, as
slowly as the client sends them. Eight connections that each send a header byte now and then
held all eight threads of the embedded default, and no one else was answered (slowloris; issue 9,
hostile re-test A1). Compose puts nginx in front, which buffers a request before gunicorn sees
it; the embedded default has no proxy. Here a request's line and headers must arrive within
``FRP_HEADER_TIMEOUT`` seconds (default 15) of the thread taking the connection, or the
connection is closed; the body is not bound by it (an upload streams at the client's pace, to
its own limit). gunicorn imports this module in its own process, before Django: no Django here.
"""

from __future__ import annotations

import errno
import os
import time

from gunicorn.http.errors import NoMoreData
from gunicorn.workers import gthread

#: Seconds a connection's thread waits for the request line and headers, in all.
HEADER_TIMEOUT = float(os.environ.get("FRP_HEADER_TIMEOUT", "15"))


class HeaderTimeout(NoMoreData):
    """The request's headers did not arrive in time (gunicorn drops the connection quietly,
    as it does a client that went away)."""

    def __str__(self) -> str:
        return f"no complete request headers within {HEADER_TIMEOUT:g} s"


class _DeadlineSocket:
    """A connection's socket as gunicorn uses it, whose ``recv`` raises :class:`HeaderTimeout`
    once ``deadline`` (``time.monotonic()``, ``None``: none) has passed; everything else is the
    socket's."""

    def __init__(self, sock):
        self._sock = sock
        self.deadline: float | None = None

    def recv(self, size: int, *flags):
        if self.deadline is None:
            return self._sock.recv(size, *flags)
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise HeaderTimeout()
        before = self._sock.gettimeout()
        self._sock.settimeout(remaining)
        try:
            return self._sock.recv(size, *flags)
        except TimeoutError:
            raise HeaderTimeout() from None
        finally:
            self._sock.settimeout(before)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class _HeaderDeadline:
    """gunicorn's request parser (an iterator of requests), each ``next`` — which reads one
    request's line and headers — bounded by :data:`HEADER_TIMEOUT`."""

    def __init__(self, parser, sock: _DeadlineSocket):
        self._parser, self._sock = parser, sock

    def __iter__(self):
        return self

    def __next__(self):
        self._sock.deadline = time.monotonic() + HEADER_TIMEOUT
        try:
            return next(self._parser)
        finally:
            self._sock.deadline = None

    def __getattr__(self, name):
        return getattr(self._parser, name)


class _Connection(gthread.TConn):
    def __init__(self, cfg, sock, client, server):
        super().__init__(cfg, _DeadlineSocket(sock), client, server)

    def init(self):
        super().init()
        if self.parser is not None and not isinstance(self.parser, _HeaderDeadline):
            self.parser = _HeaderDeadline(self.parser, self.sock)


class HeaderDeadlineWorker(gthread.ThreadWorker):
    """gunicorn's ``gthread`` worker whose connections bound their headers' arrival (module
    doc). ``accept`` is gunicorn 27's, building :class:`_Connection` instead of ``TConn``."""

    def accept(self, listener):
        try:
            client_sock, client_addr = listener.accept()
            self.nr_conns += 1
            client_sock.setblocking(True)
            conn = _Connection(self.cfg, client_sock, client_addr, listener.getsockname())
            self.enqueue_req(conn)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise

"""A TLS front for a test server: HTTPS on a free loopback port, forwarded to a plain one.

pytest-django's live server speaks HTTP only; sites talk to the portal only over HTTPS. This proxy
terminates real TLS (Python's ``ssl``, a certificate from the platform CA, ``federation.pki``) and
copies bytes both ways to the live server, as nginx does in the compose deployment.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def tls_proxy(*, cert: Path, key: Path, upstream: tuple[str, int]) -> Iterator[str]:
    """Serve HTTPS on 127.0.0.1:<free port> in front of ``upstream``; yield its base URL."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(32)
    stop = threading.Event()

    def handle(conn: socket.socket) -> None:
        try:
            tls = ctx.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            conn.close()
            return
        try:
            up = socket.create_connection(upstream, timeout=120)
        except OSError:
            tls.close()
            return
        back = threading.Thread(target=_pipe, args=(up, tls), daemon=True)
        back.start()
        _pipe(tls, up)
        back.join(timeout=120)
        for s in (tls, up):
            with contextlib.suppress(OSError):
                s.close()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()
        thread.join(timeout=10)

"""Request bodies declared larger than the portal accepts (``portal.middleware.BodyLimitMiddleware``),
issue 9, hostile re-test A: refused with 413 and a sentence naming the limit before anything reads
them, on every URL but the dataset upload, which bounds its own body with its form's message."""

from __future__ import annotations

import pytest

from tests.factories import MembershipFactory

pytestmark = pytest.mark.django_db


def test_a_body_declared_above_the_limit_is_refused_unread(client, settings):
    settings.FRP_MAX_UPLOAD_BYTES = 1000
    # The body actually sent is small: were it read for its declared length, the test client's
    # payload would raise; the answer comes before that.
    response = client.post(
        "/accounts/login/", {"login": "ada", "password": "x"}, CONTENT_LENGTH="1500000000"
    )

    assert response.status_code == 413
    text = response.content.decode()
    assert "1.4\xa0GB" in text and "1000\xa0bytes" in text and "FRP_MAX_UPLOAD_BYTES" in text


def test_a_body_within_the_limit_reaches_the_view(client, settings):
    settings.FRP_MAX_UPLOAD_BYTES = 10_000
    response = client.post("/accounts/login/", {"login": "ada", "password": "x"})
    assert response.status_code == 200  # the sign-in form again, with its error


def test_the_dataset_upload_keeps_its_own_limit_and_message(client, settings):
    settings.FRP_MAX_UPLOAD_BYTES = 1000
    steward = MembershipFactory(role="data_steward").user
    client.force_login(steward)

    response = client.post("/datasets/upload/", {}, CONTENT_LENGTH="5000")

    assert response.status_code == 413
    assert "larger than the upload limit" in response.content.decode()  # the form's own page


class _Disconnecting:
    """A WSGI input that gives ``data`` and then fails as a socket whose client went away."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def read(self, size: int = -1) -> bytes:
        if self.pos >= len(self.data):
            raise OSError("the client closed the connection")
        size = len(self.data) - self.pos if size is None or size < 0 else size
        chunk = self.data[self.pos : self.pos + size]
        self.pos += len(chunk)
        return chunk

    def readline(self, size: int = -1) -> bytes:
        return self.read(size)


def test_an_aborted_multipart_upload_leaves_no_temporary_file(settings, tmp_path):
    """Hostile re-test A2: an anonymous multipart POST whose client disconnects part-way left its
    temporary file on disk until the garbage collector ran (the upload handler holding the file
    and the request form a reference cycle). With the collector off, none may be left."""
    import gc

    from django.test import Client

    client = Client(enforce_csrf_checks=True)  # as a real server: the CSRF check reads the body
    client.cookies["csrftoken"] = "a" * 32  # with a cookie, the check reads the body's token
    settings.FILE_UPLOAD_TEMP_DIR = str(tmp_path)
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = 1000  # a part above it goes to a temporary file
    boundary = "frpboundary"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="big.csv"\r\n'
        "Content-Type: text/csv\r\n\r\n"
    ).encode()
    sent = head + b"a,b\n1,2\n" * 20_000  # 160 kB of the file, then the client is gone
    gc.disable()
    try:
        response = client.generic(
            "POST",
            "/accounts/login/",
            CONTENT_TYPE=f"multipart/form-data; boundary={boundary}",
            CONTENT_LENGTH=str(len(sent) + 1_000_000),
            **{"wsgi.input": _Disconnecting(sent)},
        )
        assert response.status_code == 403  # the token could not be read: CSRF failure
        assert list(tmp_path.iterdir()) == []
    finally:
        gc.enable()

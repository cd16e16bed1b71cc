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

"""The suite's own isolation: one test's sign-ins do not count against the next test.

allauth rate-limits sign-ins per client address (``login: 30/m/ip``) in the shared cache, and every
test client is 127.0.0.1. These two tests run in file order: the first uses up the limit and
proves it is real, the second signs in once. Without ``tests/conftest.py::_fresh_cache`` the second
fails whenever both run within the same minute.
"""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _sign_in(client: Client, user) -> int:
    client.post("/accounts/login/", {"login": user.username, "password": "pw-for-tests-123"})
    return client.get("/").status_code


def test_sign_in_limit_is_real():
    user = UserFactory()
    codes = [_sign_in(Client(), user) for _ in range(30)]
    assert codes == [200] * 30
    assert _sign_in(Client(), user) == 302  # the 31st sign-in in a minute is refused


def test_next_test_signs_in_despite_the_previous_tests_sign_ins():
    assert _sign_in(Client(), UserFactory()) == 200

"""The sign-in lock and its way out (issue 9, hostile finding F6).

allauth counts failed sign-ins per account (``login_failed``: 5 in 5 minutes by default), so
anyone who knows a username can lock its owner out by failing to sign in as them. The lock is
kept (it is what stops a password being guessed from many addresses); its owner gets out at once
by resetting the password, which needs the account's mailbox — and the message on the sign-in
page says so. Through the real views, cache and mail outbox.
"""

from __future__ import annotations

import re

import pytest
from django.core import mail
from django.core.cache import cache

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery 42"
NEW_PASSWORD = "another horse battery 43"


@pytest.fixture
def victim():
    cache.clear()
    user = UserFactory(username="vera", email="vera@uni-a.example")
    user.set_password(PASSWORD)
    user.save()
    yield user
    cache.clear()


def _login(client, login: str, password: str, ip: str):
    return client.post("/accounts/login/", {"login": login, "password": password}, REMOTE_ADDR=ip)


def test_a_locked_owner_is_told_the_way_out_and_a_password_reset_lets_them_in(client, victim):
    # An attacker fails five times, from five addresses (the per-address limit is not reached)
    for i in range(5):
        response = _login(client, "vera", f"guess-{i}", ip=f"198.51.100.{i + 1}")
        assert response.status_code == 200 and "_auth_user_id" not in client.session

    # The owner, from their own address, with the right password: refused, told why and how out
    response = _login(client, "vera", PASSWORD, ip="192.0.2.10")
    page = response.content.decode()
    assert "_auth_user_id" not in client.session
    assert "Too many failed sign-in attempts" in page
    assert "a completed reset lifts the lock at once" in page

    # The way out: a password reset through the mailbox
    response = client.post("/accounts/password/reset/", {"email": victim.email})
    assert response.status_code == 302
    assert len(mail.outbox) == 1
    link = re.search(r"https?://[^/\s]+(/accounts/password/reset/key/\S+/)", mail.outbox[0].body)
    assert link, mail.outbox[0].body
    response = client.get(link.group(1))  # allauth moves the key into the session
    assert response.status_code == 302
    response = client.post(
        response["Location"], {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD}
    )
    assert response.status_code == 302
    assert client.session.get("_auth_user_id") == str(victim.pk)  # signed in by the reset

    client.logout()
    _login(client, "vera", NEW_PASSWORD, ip="192.0.2.10")  # and the lock is lifted
    assert client.session.get("_auth_user_id") == str(victim.pk)


def test_without_a_reset_the_lock_holds_even_for_the_right_password(client, victim):
    """The lock is real (the test above is not vacuous): the right password does not pass it."""
    for i in range(5):
        _login(client, "vera", f"guess-{i}", ip=f"198.51.100.{i + 1}")
    _login(client, "vera", PASSWORD, ip="192.0.2.11")
    assert "_auth_user_id" not in client.session
    cache.clear()  # the lock's five minutes, passed
    _login(client, "vera", PASSWORD, ip="192.0.2.11")
    assert client.session.get("_auth_user_id") == str(victim.pk)


def test_an_attacker_locking_again_during_the_reset_does_not_keep_the_owner_out(client, victim):
    """A completed reset signs its owner in (``ACCOUNT_LOGIN_ON_PASSWORD_RESET``): locking the
    account again between the e-mail and the new password (5 tries per 5 minutes suffice) no
    longer keeps them out (hostile re-test of F6)."""
    for i in range(5):
        _login(client, "vera", f"guess-{i}", ip=f"198.51.100.{i + 1}")
    client.post("/accounts/password/reset/", {"email": victim.email}, REMOTE_ADDR="192.0.2.10")
    link = re.search(r"https?://[^/\s]+(/accounts/password/reset/key/\S+/)", mail.outbox[-1].body)
    form = client.get(link.group(1), REMOTE_ADDR="192.0.2.10")
    attacker = client.__class__()
    for i in range(5):
        _login(attacker, "vera", f"again-{i}", ip=f"203.0.113.{i + 1}")
    client.post(
        form["Location"],
        {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD},
        REMOTE_ADDR="192.0.2.10",
    )
    assert client.session.get("_auth_user_id") == str(victim.pk)


def _reset_as(client, email: str, ip: str):
    mail.outbox.clear()
    client.post("/accounts/password/reset/", {"email": email}, REMOTE_ADDR=ip)
    found = [
        re.search(r"https?://[^/\s]+(/accounts/password/reset/key/\S+/)", m.body)
        for m in mail.outbox
    ]
    found = [f for f in found if f]
    if not found:
        return None
    form = client.get(found[0].group(1), REMOTE_ADDR=ip)
    return client.post(
        form["Location"], {"password1": NEW_PASSWORD, "password2": NEW_PASSWORD}, REMOTE_ADDR=ip
    )


def test_someone_elses_unverified_address_does_not_lift_the_victims_lock(client, victim):
    """An attacker adds the victim's address, unverified, to their own account and resets their
    own password: allauth cleared the lock of every address of the resetting account (and the
    per-address limit with it). Now only the owner's verified names are cleared (hostile re-test
    of F6)."""
    from allauth.account.models import EmailAddress

    attacker = UserFactory(username="mallory", email="mallory@uni-b.example")
    attacker.set_password(PASSWORD)
    attacker.save()
    EmailAddress.objects.create(user=attacker, email=victim.email, verified=False, primary=False)
    other = client.__class__()
    for i in range(5):
        _login(other, victim.email, f"guess-{i}", ip="203.0.113.9")
    assert _reset_as(other, attacker.email, ip="203.0.113.9") is not None
    other.logout()
    _login(other, victim.email, PASSWORD, ip="203.0.113.9")
    assert "_auth_user_id" not in other.session  # still locked


def test_an_account_that_signs_in_only_by_sso_gets_no_reset_link(client):
    """A reset would give it a local password and, signed in on reset, pass its IdP by."""
    from allauth.socialaccount.models import SocialAccount

    user = UserFactory(username="sso-sam", email="sam@uni-a.example")
    user.set_unusable_password()
    user.save()
    SocialAccount.objects.create(user=user, provider="uni-a-oidc", uid="sub-123")
    assert _reset_as(client, user.email, ip="192.0.2.60") is None
    assert "_auth_user_id" not in client.session
    user.refresh_from_db()
    assert not user.has_usable_password()

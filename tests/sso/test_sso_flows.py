"""Single sign-on end to end, with real identity providers and the portal on pytest-django's live server.

Two OpenID Connect providers (npm ``oidc-provider`` on 127.0.0.2 and 127.0.0.3) and one SAML 2.0 IdP
(Debian SimpleSAMLphp on 127.0.0.4), started by tests/idp/fixtures.py. A ``requests`` session plays the
browser (tests/sso/browserlike.py); tests/browser/ drives a real Chromium through the same flows.
"""

from __future__ import annotations

import base64
from urllib.parse import urlparse

import pytest
import requests
from allauth.socialaccount.models import SocialAccount
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.urls import reverse
from lxml import etree

from portal import services
from portal.models import Institution, Membership, Role
from tests.sso.browserlike import form_with, forms, submit

pytestmark = [pytest.mark.integration]

User = get_user_model()


# ---------------------------------------------------------------------------------------------
# Arrange helpers: an institution per IdP, configured through the same service the admin page uses
# ---------------------------------------------------------------------------------------------


def connect_oidc(live_server, oidc, slug: str):
    inst = Institution.objects.create(
        slug=slug, name=f"Institution {slug}", email_domain=f"{slug}.example"
    )
    idp = services.identity_provider_configure(
        by=None,
        institution=inst,
        protocol="oidc",
        issuer=oidc.issuer,
        client_id=f"portal-{slug}",
        client_secret=f"secret-{slug}",
    )
    callback = live_server.url + reverse(
        "openid_connect_callback", kwargs={"provider_id": idp.provider_id}
    )
    oidc.add_client(f"portal-{slug}", f"secret-{slug}", [callback])
    return idp


def connect_saml(live_server, saml, slug: str):
    inst = Institution.objects.create(
        slug=slug, name=f"Institution {slug}", email_domain=f"{slug}.example"
    )
    idp = services.identity_provider_configure(
        by=None,
        institution=inst,
        protocol="saml",
        entity_id=saml.entity_id,
        sso_url=saml.sso_url,
        x509cert=saml.x509_cert,
        uid_attribute="uid",
        email_attribute="mail",
    )
    kwargs = {"organization_slug": idp.provider_id}
    saml.add_sp(
        live_server.url + reverse("saml_metadata", kwargs=kwargs),
        live_server.url + reverse("saml_acs", kwargs=kwargs),
    )
    return idp


def start_sign_in(live_server, idp) -> tuple[requests.Session, requests.Response]:
    """Open the portal's sign-in page and press the institution's button (a CSRF-protected POST)."""
    browser = requests.Session()
    page = browser.get(f"{live_server.url}/accounts/login/", timeout=30)
    button = next(f for f in forms(page.text) if f.action == idp.login_path)
    return browser, submit(browser, page, button)


def oidc_sign_in(live_server, idp, oidc, login: str, password: str):
    browser, page = start_sign_in(live_server, idp)
    assert urlparse(page.url).hostname == oidc.host, page.url
    page = submit(browser, page, form_with(page.text, "password"), login=login, password=password)
    return browser, _consent(browser, page, oidc)


def _consent(browser, page, oidc):
    """Grant consent if the IdP asks (a form without a password field); at most twice."""
    for _ in range(2):
        pending = [f for f in forms(page.text) if "password" not in f.fields]
        if urlparse(page.url).hostname != oidc.host or not pending:
            break
        page = submit(browser, page, pending[0])
    return page


def saml_response_form(live_server, idp, saml, username: str, password: str):
    """SP-initiated SAML up to the IdP's auto-POST form (not yet posted to the portal's ACS)."""
    browser, page = start_sign_in(live_server, idp)
    assert urlparse(page.url).hostname == saml.host, page.url
    page = submit(
        browser, page, form_with(page.text, "password"), username=username, password=password
    )
    return browser, page, form_with(page.text, "SAMLResponse")


def signed_in_user(browser: requests.Session, live_server):
    """The user the portal sees for this browser, or None (dashboard redirects to sign-in)."""
    r = browser.get(f"{live_server.url}/", allow_redirects=False, timeout=30)
    if r.status_code != 200:
        return None
    key = browser.cookies.get("sessionid")
    session = Session.objects.get(session_key=key)
    return User.objects.get(pk=session.get_decoded()["_auth_user_id"])


# ---------------------------------------------------------------------------------------------
# OpenID Connect
# ---------------------------------------------------------------------------------------------


def test_oidc_sign_in_creates_researcher_keyed_by_idp_and_subject(live_server, oidc_idp_a):
    idp = connect_oidc(live_server, oidc_idp_a, "inst-a")

    browser, page = oidc_sign_in(live_server, idp, oidc_idp_a, "alice", "alice-pass-A")

    user = signed_in_user(browser, live_server)
    assert user is not None, page.text[:1000]
    assert user.email == "alice@inst-a.example"
    account = SocialAccount.objects.get(user=user)
    assert (account.provider, account.uid) == (idp.provider_id, "a-1001")
    assert Membership.objects.filter(
        user=user, institution=idp.institution, role=Role.RESEARCHER
    ).exists()


def test_oidc_second_sign_in_reuses_account(live_server, oidc_idp_a):
    idp = connect_oidc(live_server, oidc_idp_a, "inst-a")
    first, _ = oidc_sign_in(live_server, idp, oidc_idp_a, "alice", "alice-pass-A")
    second, _ = oidc_sign_in(live_server, idp, oidc_idp_a, "alice", "alice-pass-A")
    assert signed_in_user(first, live_server) == signed_in_user(second, live_server)
    assert User.objects.count() == 1


def test_oidc_wrong_password_signs_nobody_in(live_server, oidc_idp_a):
    idp = connect_oidc(live_server, oidc_idp_a, "inst-a")
    browser, _ = oidc_sign_in(live_server, idp, oidc_idp_a, "alice", "wrong")
    assert signed_in_user(browser, live_server) is None
    assert not User.objects.exists()


def test_same_subject_at_two_idps_gives_two_accounts(live_server, oidc_idp_a, oidc_idp_b):
    idp_a = connect_oidc(live_server, oidc_idp_a, "inst-a")
    idp_b = connect_oidc(live_server, oidc_idp_b, "inst-b")
    alice_browser, _ = oidc_sign_in(live_server, idp_a, oidc_idp_a, "alice", "alice-pass-A")
    carol_browser, _ = oidc_sign_in(
        live_server, idp_b, oidc_idp_b, "carol", "carol-pass-B"
    )  # sub a-1001 too
    alice, carol = (
        signed_in_user(alice_browser, live_server),
        signed_in_user(carol_browser, live_server),
    )
    assert alice is not None and carol is not None and alice != carol
    assert SocialAccount.objects.get(user=carol).provider == idp_b.provider_id


def test_idp_asserting_existing_email_never_reaches_that_account(
    live_server, oidc_idp_a, oidc_idp_b
):
    idp_a = connect_oidc(live_server, oidc_idp_a, "inst-a")
    idp_b = connect_oidc(live_server, oidc_idp_b, "inst-b")
    oidc_sign_in(live_server, idp_a, oidc_idp_a, "alice", "alice-pass-A")
    alice = User.objects.get(email="alice@inst-a.example")

    browser, page = oidc_sign_in(live_server, idp_b, oidc_idp_b, "mallory", "mallory-pass-B")

    # B is not trusted for inst-a.example: the address is dropped, mallory gets her own account
    mallory = signed_in_user(browser, live_server)
    assert mallory is not None and mallory != alice
    assert mallory.email == "" and _verified(mallory) == {}
    assert list(SocialAccount.objects.filter(user=alice).values_list("provider", flat=True)) == [
        idp_a.provider_id
    ]
    assert User.objects.get(pk=alice.pk).email == "alice@inst-a.example"


def test_email_uniqueness_ignores_case(live_server, oidc_idp_a):
    User.objects.create_user(
        "local-alice", email="ALICE@inst-a.example", password="pw-for-tests-123"
    )
    idp = connect_oidc(live_server, oidc_idp_a, "inst-a")
    browser, page = oidc_sign_in(live_server, idp, oidc_idp_a, "alice", "alice-pass-A")
    assert page.status_code == 403
    assert signed_in_user(browser, live_server) is None


def test_disabled_idp_signs_nobody_in(live_server, oidc_idp_a):
    idp = connect_oidc(live_server, oidc_idp_a, "inst-a")
    services.identity_provider_configure(
        by=None,
        institution=idp.institution,
        protocol="oidc",
        issuer=oidc_idp_a.issuer,
        client_id="portal-inst-a",
        client_secret="",
        enabled=False,
    )
    browser = requests.Session()
    page = browser.get(f"{live_server.url}/accounts/login/", timeout=30)
    assert idp.login_path not in page.text  # not offered
    r = browser.post(
        live_server.url + idp.login_path,
        data={"csrfmiddlewaretoken": browser.cookies["csrftoken"]},
        headers={"Referer": page.url},
        timeout=30,
    )
    assert signed_in_user(browser, live_server) is None, r.url


def test_sign_in_rotates_session_key_and_sign_out_ends_session(live_server, oidc_idp_a):
    idp = connect_oidc(live_server, oidc_idp_a, "inst-a")
    browser, page = start_sign_in(live_server, idp)
    before = browser.cookies.get("sessionid")  # the anonymous session holding the OIDC state
    assert before
    page = submit(
        browser, page, form_with(page.text, "password"), login="alice", password="alice-pass-A"
    )
    while urlparse(page.url).hostname == oidc_idp_a.host and forms(page.text):
        page = submit(browser, page, forms(page.text)[0])
    after = browser.cookies.get("sessionid")
    assert after and after != before
    assert not Session.objects.filter(session_key=before).exists()

    dashboard = browser.get(f"{live_server.url}/", timeout=30)
    logout = next(f for f in forms(dashboard.text) if f.action == reverse("account_logout"))
    submit(browser, dashboard, logout)
    assert not Session.objects.filter(session_key=after).exists()
    thief = requests.Session()
    thief.cookies.set("sessionid", after)
    assert thief.get(f"{live_server.url}/", allow_redirects=False, timeout=30).status_code == 302


def test_sign_in_by_email_domain_offers_the_institution(live_server, oidc_idp_a):
    idp = connect_oidc(live_server, oidc_idp_a, "inst-a")
    browser = requests.Session()
    page = browser.get(f"{live_server.url}/accounts/login/", timeout=30)
    page = submit(browser, page, form_with(page.text, "email"), email="someone@dept.inst-a.example")
    assert any(f.action == idp.login_path for f in forms(page.text))


# ---------------------------------------------------------------------------------------------
# SAML 2.0
# ---------------------------------------------------------------------------------------------


def test_saml_sign_in_creates_researcher(live_server, saml_idp):
    idp = connect_saml(live_server, saml_idp, "inst-c")
    browser, page, response_form = saml_response_form(
        live_server, idp, saml_idp, "dave", "dave-pass-C"
    )
    submit(browser, page, response_form)
    user = signed_in_user(browser, live_server)
    assert user is not None and user.email == "dave@inst-c.example"
    assert SocialAccount.objects.get(user=user).uid == "dave"
    assert Membership.objects.filter(
        user=user, institution=idp.institution, role=Role.RESEARCHER
    ).exists()


def test_saml_consumed_response_replayed_is_refused(live_server, saml_idp):
    idp = connect_saml(live_server, saml_idp, "inst-c")
    browser, page, response_form = saml_response_form(
        live_server, idp, saml_idp, "dave", "dave-pass-C"
    )
    submit(browser, page, response_form)
    assert signed_in_user(browser, live_server) is not None

    attacker = requests.Session()  # the captured POST, replayed from another browser
    submit(attacker, page, response_form)
    assert signed_in_user(attacker, live_server) is None

    submit(browser, page, response_form)  # and again in the original session: state was consumed
    assert SocialAccount.objects.count() == 1


def _strip_signatures(saml_response_b64: str) -> str:
    root = etree.fromstring(base64.b64decode(saml_response_b64))  # noqa: S320 — our own IdP's output
    signatures = root.findall(".//{http://www.w3.org/2000/09/xmldsig#}Signature")
    assert signatures, "the IdP should have signed the response"
    for sig in signatures:
        sig.getparent().remove(sig)
    return base64.b64encode(etree.tostring(root)).decode()


def test_saml_unsigned_assertion_is_refused(live_server, saml_idp):
    idp = connect_saml(live_server, saml_idp, "inst-c")
    browser, page, response_form = saml_response_form(
        live_server, idp, saml_idp, "dave", "dave-pass-C"
    )
    response_form.fields["SAMLResponse"] = _strip_signatures(response_form.fields["SAMLResponse"])
    submit(browser, page, response_form)
    assert signed_in_user(browser, live_server) is None
    assert not SocialAccount.objects.exists()


# ---------------------------------------------------------------------------------------------
# Issue 9, finding 2: an IdP's e-mail counts as verified only where the IdP is trusted for it
# ---------------------------------------------------------------------------------------------


def _verified(user) -> dict[str, bool]:
    from allauth.account.models import EmailAddress

    return dict(EmailAddress.objects.filter(user=user).values_list("email", "verified"))


def test_sso_email_counts_as_verified_only_in_the_idps_own_domain(
    live_server, oidc_idp_a, oidc_idp_b
):
    """A's alice (own domain, verified by A) claims her invitation; B's mallory, who asserts
    alice's address, and A's bob (whom A itself does not vouch for) claim none."""
    from portal.models import ProjectRole
    from portal.selectors import invitations_for_user
    from tests.factories import ProjectFactory, ProjectMemberFactory

    idp_a = connect_oidc(live_server, oidc_idp_a, "inst-a")
    idp_b = connect_oidc(live_server, oidc_idp_b, "inst-b")
    project = ProjectFactory()
    pi = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    to_alice = services.project_invite(by=pi, project=project, email="alice@inst-a.example")
    services.project_invite(by=pi, project=project, email="bob@inst-a.example")

    mallory_browser, _ = oidc_sign_in(live_server, idp_b, oidc_idp_b, "mallory", "mallory-pass-B")
    mallory = signed_in_user(mallory_browser, live_server)
    assert mallory is not None and _verified(mallory) == {} and mallory.email == ""
    assert list(invitations_for_user(user=mallory)) == []

    bob_browser, _ = oidc_sign_in(live_server, idp_a, oidc_idp_a, "bob", "bob-pass-A")
    bob = signed_in_user(bob_browser, live_server)
    assert _verified(bob) == {} and bob.email == ""  # A says email_verified: false
    assert list(invitations_for_user(user=bob)) == []

    # mallory still exists (hostile re-test, finding 2a: she used to hold the address and the
    # username "alice", and the real alice was then refused with 403)
    alice_browser, page = oidc_sign_in(live_server, idp_a, oidc_idp_a, "alice", "alice-pass-A")
    alice = signed_in_user(alice_browser, live_server)
    assert page.status_code == 200 and alice is not None and alice != mallory
    assert _verified(alice) == {"alice@inst-a.example": True}
    assert list(invitations_for_user(user=alice)) == [to_alice]
    assert (alice.username, alice.email) == ("alice", "alice@inst-a.example")
    assert mallory.username == "inst-b-b-2001"  # from B and its subject, not A's address

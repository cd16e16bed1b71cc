"""Issue 9, finding 3: the OIDC issuer field was a server-side fetch of any URL.

Reproduced on main: loopback and private issuers (and ``ftp://``) were accepted, an anonymous
visitor's sign-in POST made the portal fetch them, and a fetch error was a 500. The issuers here are
real HTTP servers on loopback (Python's ``http.server`` on an OS-picked port) or closed ports.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client

from portal import oidc_guard, services
from portal.models import Membership, Role
from tests.factories import InstitutionFactory, UserFactory

pytestmark = pytest.mark.django_db


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections are refused


class _Issuer:
    """An HTTP server answering every GET with ``status``, ``headers`` and ``body`` (JSON)."""

    def __init__(self, status=200, body=None, headers=None):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 — http.server's name
                outer.paths.append(self.path)
                payload = json.dumps(outer.body).encode()
                self.send_response(outer.status)
                for k, v in (outer.headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.status, self.body, self.headers, self.paths = status, body or {}, headers, []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def issuer_server():
    servers = []

    def make(**kw):
        servers.append(_Issuer(**kw))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _configure(issuer: str, institution=None):
    return services.identity_provider_configure(
        by=None,
        institution=institution or InstitutionFactory(),
        protocol="oidc",
        issuer=issuer,
        client_id="portal",
        client_secret="client-secret",
    )


@pytest.mark.parametrize(
    ("issuer", "why"),
    [
        ("ftp://idp.example.org/", "must start with https://"),
        ("http://127.0.0.1:8000/", "a loopback address"),
        ("http://localhost:8000/", "a loopback address"),
        ("http://[::1]/", "a loopback address"),
        ("http://10.1.2.3/", "a private address"),
        ("http://192.168.0.10/", "a private address"),
        ("http://169.254.169.254/latest/meta-data/", "a cloud metadata address"),
        ("http://169.254.10.1/", "a link-local address"),
        ("http://0.0.0.0/", "an unspecified address"),
        ("https://admin:pw@idp.example.org/", "user name or password"),
        # Hostile re-test, variant 3a: is_private is False for these, is_global too.
        ("http://100.64.0.1/", "not a public address"),  # RFC 6598 shared address space
        ("http://100.100.100.200/latest/meta-data/", "a cloud metadata address"),  # Alibaba
        ("http://192.0.0.8/", "not a public address"),  # IETF protocol assignments
        ("http://[2002:7f00:1::1]/", "not a public address"),  # 6to4 of 127.0.0.1
    ],
)
def test_issuer_on_internal_addresses_is_refused_when_saved(settings, issuer, why):
    settings.FRP_OIDC_ALLOWED_HOSTS = []

    with pytest.raises(services.IdentityProviderError) as err:
        _configure(issuer)

    (message,) = err.value.field_errors["issuer"]
    assert why in message


def test_http_issuer_refused_outside_debug(settings):
    settings.FRP_OIDC_ALLOW_HTTP = False

    with pytest.raises(services.IdentityProviderError) as err:
        _configure("http://idp.example.org/")

    assert "must start with https://" in err.value.field_errors["issuer"][0]


@pytest.mark.parametrize("allowed", [["127.0.0.1"], ["127.0.0.0/8"], ["localhost"]])
def test_the_allow_list_names_internal_issuers(settings, allowed):
    settings.FRP_OIDC_ALLOWED_HOSTS = allowed
    host = "localhost" if allowed == ["localhost"] else "127.0.0.1"

    idp = _configure(f"http://{host}:8000/")

    assert idp.issuer == f"http://{host}:8000/"


def test_the_allow_list_names_a_shared_address_space_issuer(settings):
    """An operator whose IdP lives in 100.64.0.0/10 (carrier-grade NAT, Tailscale) names it."""
    settings.FRP_OIDC_ALLOWED_HOSTS = ["100.64.0.0/10"]

    assert oidc_guard.check_url("http://100.64.0.10/", must_resolve=False)


def test_every_fetch_is_checked_even_of_urls_the_issuer_names(settings):
    settings.FRP_OIDC_ALLOWED_HOSTS = []
    session = oidc_guard.guarded_session()
    with pytest.raises(oidc_guard.IssuerError, match="cloud metadata"):
        session.get("http://169.254.169.254/latest/meta-data/iam/")


def test_a_discovery_document_pointing_inside_is_refused(settings, issuer_server):
    settings.FRP_OIDC_ALLOWED_HOSTS = ["127.0.0.1"]
    server = issuer_server()
    server.body = {
        "issuer": server.url,
        "authorization_endpoint": f"{server.url}/auth",
        "token_endpoint": "http://169.254.169.254/latest/meta-data/",
        "jwks_uri": f"{server.url}/jwks",
    }

    with pytest.raises(oidc_guard.IssuerError, match="cloud metadata"):
        oidc_guard.discover(server.url)


def test_redirects_are_not_followed(settings, issuer_server):
    settings.FRP_OIDC_ALLOWED_HOSTS = ["127.0.0.1"]
    server = issuer_server(status=302, headers={"Location": "http://169.254.169.254/"})

    with pytest.raises(oidc_guard.IssuerError, match="redirects"):
        oidc_guard.discover(server.url)
    assert server.paths == ["/.well-known/openid-configuration"]


def test_sign_in_with_an_issuer_that_does_not_answer_is_a_message_not_a_500():
    idp = _configure(f"http://127.0.0.1:{_closed_port()}/")  # allowed by the tests' allow-list
    visitor = Client(raise_request_exception=False)

    response = visitor.post(idp.login_path, follow=True)

    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == "/accounts/login/"
    assert "Single sign-on is unavailable: the issuer did not answer: connection refused" in (
        response.content.decode()
    )


def test_idp_settings_page_says_when_the_issuer_does_not_answer(client):
    institution = InstitutionFactory()
    admin = UserFactory()
    Membership.objects.create(user=admin, institution=institution, role=Role.INSTITUTION_ADMIN)
    client.force_login(admin)
    url = f"/institutions/{institution.slug}/identity-provider/"

    refused = client.post(
        url,
        {
            "protocol": "oidc",
            "enabled": "on",
            "issuer": "http://169.254.169.254/",
            "client_id": "c",
            "client_secret": "s",
        },
    )
    saved = client.post(
        url,
        {
            "protocol": "oidc",
            "enabled": "on",
            "issuer": f"http://127.0.0.1:{_closed_port()}/",
            "client_id": "c",
            "client_secret": "s",
        },
        follow=True,
    )

    assert refused.status_code == 200
    assert (
        "Not allowed" in refused.content.decode() and "cloud metadata" in refused.content.decode()
    )
    page = saved.content.decode()
    assert "Saved, but sign-in will fail until this is fixed: the issuer did not answer" in page

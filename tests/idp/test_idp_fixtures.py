"""The test IdPs do what a relying party / service provider expects, driven with ``requests``.

OpenID Connect: discovery, authorization code flow through the real login form (with and without
PKCE, client_secret_post and client_secret_basic), ID token signature checked against the JWKS,
userinfo, wrong password, wrong PKCE verifier, unregistered redirect URI.
SAML 2.0: metadata with the signing certificate, SP-initiated (HTTP-Redirect AuthnRequest) and
IdP-initiated flows through the UserPass form to the auto-POST form with a signed Response and
Assertion, wrong password, unknown SP. The signatures themselves are checked by the portal's
python3-saml tests, not here.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
import secrets
import time
import uuid
import zlib
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit
from xml.etree import ElementTree as ET  # noqa: S405 - parses our own test IdP's output

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.idp.fixtures import (
    ACCOUNTS_A,
    ACCOUNTS_B,
    OIDC_HOST_A,
    OIDC_HOST_B,
    SAML_HOST,
    SAML_USERS,
)
from tests.idp.saml import NAMEID_PERSISTENT, OID

pytestmark = pytest.mark.integration

# Nothing listens here: the flow stops at the redirect to it and never follows it.
PORTAL = "http://localhost:9"

NS = {
    "md": "urn:oasis:names:tc:SAML:2.0:metadata",
    "ds": "http://www.w3.org/2000/09/xmldsig#",
    "samlp": "urn:oasis:names:tc:SAML:2.0:protocol",
    "saml": "urn:oasis:names:tc:SAML:2.0:assertion",
}


# --------------------------------------------------------------------------------------------
# helpers


def browser() -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # loopback only: never through a proxy from the environment
    return s


def b64url_decode(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


def pkce_pair() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
    return verifier, challenge.decode()


class Forms(HTMLParser):
    """Collects <form action method> and their <input name value> (enough for these pages)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.forms: list[dict] = []
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form":
            self.forms.append(
                {"action": a.get("action", ""), "method": a.get("method", "get"), "fields": {}}
            )
        elif tag == "input" and self.forms and a.get("name"):
            self.forms[-1]["fields"][a["name"]] = a.get("value") or ""


def only_form(resp: requests.Response) -> dict:
    forms = Forms(resp.text).forms
    assert len(forms) == 1, f"expected one form on {resp.url}, got {forms}\n{resp.text[:2000]}"
    form = forms[0]
    form["action"] = urljoin(resp.url, form["action"])
    return form


def follow(
    session: requests.Session,
    resp: requests.Response,
    *,
    stop_at: str | None = None,
    limit: int = 10,
):
    """Follow redirects until a page (returned) or a redirect to ``stop_at…`` (its URL returned)."""
    for _ in range(limit):
        if not resp.is_redirect:
            return resp
        location = urljoin(resp.url, resp.headers["Location"])
        if stop_at and location.startswith(stop_at):
            return location
        resp = session.get(location, allow_redirects=False, timeout=10)
    raise AssertionError(f"too many redirects, last {resp.url}")


def verify_jwt(token: str, jwks: dict) -> dict:
    header_b64, payload_b64, sig_b64 = token.split(".")
    header = json.loads(b64url_decode(header_b64))
    assert header["alg"] == "RS256"
    jwk = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    public_key = rsa.RSAPublicNumbers(
        e=int.from_bytes(b64url_decode(jwk["e"]), "big"),
        n=int.from_bytes(b64url_decode(jwk["n"]), "big"),
    ).public_key()
    # raises InvalidSignature
    public_key.verify(
        b64url_decode(sig_b64),
        f"{header_b64}.{payload_b64}".encode(),
        padding.PKCS1v15(),
        hashes.SHA256(),
    )
    return json.loads(b64url_decode(payload_b64))


def authorize(idp, session, client, *, nonce, state, pkce_challenge=None, redirect_uri=None):
    params = {
        "response_type": "code",
        "client_id": client["client_id"],
        "redirect_uri": redirect_uri or client["redirect_uris"][0],
        "scope": "openid email profile",
        "state": state,
        "nonce": nonce,
    }
    if pkce_challenge:
        params |= {"code_challenge": pkce_challenge, "code_challenge_method": "S256"}
    disco = session.get(idp.discovery_url, timeout=10).json()
    return session.get(
        disco["authorization_endpoint"], params=params, allow_redirects=False, timeout=10
    )


def login(session, login_page: requests.Response, username: str, password: str):
    form = only_form(login_page)
    assert set(form["fields"]) >= {"login", "password"}
    assert form["method"].lower() == "post"
    return session.post(
        form["action"],
        data={"login": username, "password": password},
        allow_redirects=False,
        timeout=10,
    )


def code_from(callback_url: str, *, redirect_uri: str, state: str, issuer: str) -> str:
    assert callback_url.startswith(redirect_uri + "?")
    query = parse_qs(urlsplit(callback_url).query)
    assert "error" not in query, query
    assert query["state"] == [state]
    assert query["iss"] == [issuer]  # RFC 9207
    return query["code"][0]


def oidc_login_code(idp, client, account, *, pkce_challenge=None):
    session = browser()
    state, nonce = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    redirect_uri = client["redirect_uris"][0]
    page = follow(
        session,
        authorize(idp, session, client, nonce=nonce, state=state, pkce_challenge=pkce_challenge),
        stop_at=redirect_uri,
    )
    assert isinstance(page, requests.Response) and page.status_code == 200, page
    assert "/interaction/" in page.url
    callback = follow(
        session, login(session, page, account["login"], account["password"]), stop_at=redirect_uri
    )
    assert isinstance(callback, str), callback.text[:2000]
    code = code_from(callback, redirect_uri=redirect_uri, state=state, issuer=idp.issuer)
    return session, code, nonce


def new_client(idp, *, auth_method="client_secret_post"):
    client_id = f"portal-{uuid.uuid4().hex[:8]}"
    return idp.add_client(
        client_id,
        secrets.token_urlsafe(24),
        [f"{PORTAL}/accounts/oidc/{client_id}/login/callback/"],
        token_endpoint_auth_method=auth_method,
    )


# --------------------------------------------------------------------------------------------
# OpenID Connect


def test_oidc_discovery(oidc_idp_a, oidc_idp_b):
    for idp, host in ((oidc_idp_a, OIDC_HOST_A), (oidc_idp_b, OIDC_HOST_B)):
        assert idp.host == host
        assert idp.issuer == f"http://{host}:{idp.port}"
        resp = browser().get(idp.discovery_url, timeout=10)
        assert resp.status_code == 200
        disco = resp.json()
        assert disco["issuer"] == idp.issuer
        for key, url in (
            ("authorization_endpoint", idp.authorization_endpoint),
            ("token_endpoint", idp.token_endpoint),
            ("userinfo_endpoint", idp.userinfo_endpoint),
            ("jwks_uri", idp.jwks_uri),
        ):
            assert disco[key] == url
        assert {"openid", "email", "profile"} <= set(disco["scopes_supported"])
        assert {"sub", "email", "email_verified", "name"} <= set(disco["claims_supported"])
        assert "S256" in disco["code_challenge_methods_supported"]
        assert {"client_secret_basic", "client_secret_post"} <= set(
            disco["token_endpoint_auth_methods_supported"]
        )
        assert "code" in disco["response_types_supported"]
        assert idp.running


def test_oidc_code_flow_pkce_client_secret_post(oidc_idp_a):
    idp, account = oidc_idp_a, ACCOUNTS_A[0]
    client = new_client(idp)
    verifier, challenge = pkce_pair()
    session, code, nonce = oidc_login_code(idp, client, account, pkce_challenge=challenge)

    token_resp = requests.post(
        idp.token_endpoint,
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": client["redirect_uris"][0],
            "code_verifier": verifier,
            "client_id": client["client_id"],
            "client_secret": client["client_secret"],
        },
        timeout=10,
    )
    assert token_resp.status_code == 200, token_resp.text
    tokens = token_resp.json()
    assert tokens["token_type"].lower() == "bearer"

    jwks = requests.get(idp.jwks_uri, timeout=10).json()
    claims = verify_jwt(tokens["id_token"], jwks)
    assert claims["iss"] == idp.issuer
    assert claims["aud"] == client["client_id"]
    assert claims["nonce"] == nonce
    assert claims["sub"] == account["sub"]
    assert claims["email"] == account["email"]
    assert claims["email_verified"] is True
    assert claims["name"] == account["name"]
    assert claims["exp"] > time.time()

    userinfo = requests.get(
        idp.userinfo_endpoint,
        headers={"Authorization": f"Bearer {tokens['access_token']}"},
        timeout=10,
    ).json()
    assert userinfo == {
        "sub": account["sub"],
        "email": account["email"],
        "email_verified": True,
        "name": account["name"],
    }

    # The code is single-use.
    again = requests.post(
        idp.token_endpoint,
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": client["redirect_uris"][0],
            "code_verifier": verifier,
            "client_id": client["client_id"],
            "client_secret": client["client_secret"],
        },
        timeout=10,
    )
    assert again.status_code == 400 and again.json()["error"] == "invalid_grant"

    # The IdP session cookie works over plain HTTP: a second sign-in needs no password.
    state = secrets.token_urlsafe(8)
    result = follow(
        session,
        authorize(idp, session, client, nonce="n2", state=state),
        stop_at=client["redirect_uris"][0],
    )
    assert isinstance(result, str), "expected single sign-on without a login form"
    code_from(result, redirect_uri=client["redirect_uris"][0], state=state, issuer=idp.issuer)


def test_oidc_code_flow_no_pkce_client_secret_basic(oidc_idp_b):
    idp, account = oidc_idp_b, ACCOUNTS_B[0]
    client = new_client(idp, auth_method="client_secret_basic")
    _session, code, nonce = oidc_login_code(idp, client, account)
    redirect_uri = client["redirect_uris"][0]
    data = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri}

    wrong = requests.post(
        idp.token_endpoint, data=data, auth=(client["client_id"], "wrong-secret"), timeout=10
    )
    assert wrong.status_code == 401 and wrong.json()["error"] == "invalid_client"

    token_resp = requests.post(
        idp.token_endpoint,
        data=data,
        auth=(client["client_id"], client["client_secret"]),
        timeout=10,
    )
    assert token_resp.status_code == 200, token_resp.text
    claims = verify_jwt(
        token_resp.json()["id_token"], requests.get(idp.jwks_uri, timeout=10).json()
    )
    assert claims["iss"] == idp.issuer
    assert claims["sub"] == account["sub"] == ACCOUNTS_A[0]["sub"]  # same sub, other IdP
    assert claims["email"] == account["email"]
    assert claims["nonce"] == nonce


def test_oidc_unverified_email_and_login_by_email(oidc_idp_a):
    idp, account = oidc_idp_a, ACCOUNTS_A[1]
    client = new_client(idp)
    _session, code, _nonce = oidc_login_code(idp, client, account | {"login": account["email"]})
    tokens = requests.post(
        idp.token_endpoint,
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": client["redirect_uris"][0],
            "client_id": client["client_id"],
            "client_secret": client["client_secret"],
        },
        timeout=10,
    ).json()
    claims = verify_jwt(tokens["id_token"], requests.get(idp.jwks_uri, timeout=10).json())
    assert claims["sub"] == account["sub"]
    assert claims["email_verified"] is False


def test_oidc_wrong_password(oidc_idp_a):
    idp, account = oidc_idp_a, ACCOUNTS_A[0]
    client = new_client(idp)
    session = browser()
    page = follow(
        session,
        authorize(idp, session, client, nonce="n", state="s"),
        stop_at=client["redirect_uris"][0],
    )
    resp = login(session, page, account["login"], "not-the-password")
    assert resp.status_code == 401
    assert "Invalid username or password" in resp.text
    assert (
        only_form(resp)["action"] == only_form(page)["action"]
    )  # the form again, same interaction
    resp = login(session, page, "nobody", account["password"])
    assert resp.status_code == 401

    # The right password still works in the same interaction afterwards.
    callback = follow(
        session,
        login(session, page, account["login"], account["password"]),
        stop_at=client["redirect_uris"][0],
    )
    assert isinstance(callback, str) and "code=" in callback


def test_oidc_pkce_verifier_mismatch(oidc_idp_a):
    idp = oidc_idp_a
    client = new_client(idp)
    _verifier, challenge = pkce_pair()
    _session, code, _nonce = oidc_login_code(idp, client, ACCOUNTS_A[0], pkce_challenge=challenge)
    resp = requests.post(
        idp.token_endpoint,
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": client["redirect_uris"][0],
            "code_verifier": pkce_pair()[0],
            "client_id": client["client_id"],
            "client_secret": client["client_secret"],
        },
        timeout=10,
    )
    assert resp.status_code == 400
    assert resp.json()["error"] == "invalid_grant"


def test_oidc_unregistered_redirect_uri_is_refused(oidc_idp_a):
    idp = oidc_idp_a
    client = new_client(idp)
    session = browser()
    resp = authorize(idp, session, client, nonce="n", state="s", redirect_uri=f"{PORTAL}/evil/")
    assert resp.status_code == 400  # an error page at the IdP, no redirect to the unknown URI
    assert "redirect_uri" in resp.text


def test_oidc_factory_inline_client_and_stop(oidc_provider_factory):
    client = {
        "client_id": "inline",
        "client_secret": "inline-secret",
        "redirect_uris": [f"{PORTAL}/cb/"],
    }
    account = {
        "sub": "x-1",
        "login": "xavier",
        "password": "pw-x",
        "email": "x@example.org",
        "name": "X",
    }
    idp = oidc_provider_factory(host="127.0.0.5", clients=[client], accounts=[account])
    assert idp.startup_seconds < 15
    assert idp.client("inline")["token_endpoint_auth_method"] == "client_secret_post"
    _session, code, _nonce = oidc_login_code(idp, idp.client("inline"), account)
    assert code
    idp.stop()
    assert not idp.running
    # Every process of the IdP's group is gone, so nothing of it still holds its port. (Probing the
    # address instead is racy: once freed, the kernel may give the port to another test's server.)
    with pytest.raises(ProcessLookupError):
        os.killpg(idp._proc.pid, 0)


# --------------------------------------------------------------------------------------------
# SAML 2.0


def authn_request(idp, *, sp_entity_id: str, acs_url: str) -> tuple[str, str]:
    request_id = f"_{uuid.uuid4().hex}"
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    xml = (
        '<samlp:AuthnRequest xmlns:samlp="urn:oasis:names:tc:SAML:2.0:protocol" '
        'xmlns:saml="urn:oasis:names:tc:SAML:2.0:assertion" '
        f'ID="{request_id}" Version="2.0" IssueInstant="{now}" Destination="{idp.sso_url}" '
        'ProtocolBinding="urn:oasis:names:tc:SAML:2.0:bindings:HTTP-POST" '
        f'AssertionConsumerServiceURL="{acs_url}">'
        f"<saml:Issuer>{sp_entity_id}</saml:Issuer>"
        '<samlp:NameIDPolicy Format="urn:oasis:names:tc:SAML:1.1:nameid-format:unspecified" '
        'AllowCreate="true"/>'
        "</samlp:AuthnRequest>"
    )
    deflater = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, -15)  # raw DEFLATE
    encoded = base64.b64encode(deflater.compress(xml.encode()) + deflater.flush()).decode()
    return request_id, f"{idp.sso_url}?{urlencode({'SAMLRequest': encoded, 'RelayState': 'rs-42'})}"


def saml_login(session, start: requests.Response, username: str, password: str):
    page = follow(session, start)
    assert isinstance(page, requests.Response) and page.status_code == 200, page
    assert "loginuserpass" in page.url
    form = only_form(page)
    assert {"username", "password", "AuthState"} <= set(form["fields"])
    data = form["fields"] | {"username": username, "password": password}
    resp = session.post(form["action"], data=data, allow_redirects=False, timeout=10)
    return follow(session, resp)


def saml_response_from(page: requests.Response, acs_url: str) -> tuple[ET.Element, dict]:
    form = only_form(page)
    assert form["action"] == acs_url, form
    assert form["method"].lower() == "post"
    xml = base64.b64decode(form["fields"]["SAMLResponse"])
    return ET.fromstring(xml), form["fields"]  # noqa: S314 - our own test IdP's output


def attributes(assertion: ET.Element) -> dict[str, list[str]]:
    return {
        a.get("Name"): [v.text for v in a.findall("saml:AttributeValue", NS)]
        for a in assertion.findall("saml:AttributeStatement/saml:Attribute", NS)
    }


def new_sp(idp) -> tuple[str, str]:
    slug = uuid.uuid4().hex[:8]
    entity_id = f"{PORTAL}/accounts/saml/{slug}/metadata/"
    acs_url = f"{PORTAL}/accounts/saml/{slug}/acs/"
    idp.add_sp(entity_id, acs_url)
    return entity_id, acs_url


def test_saml_metadata(saml_idp):
    idp = saml_idp
    assert idp.host == SAML_HOST
    resp = browser().get(idp.metadata_url, timeout=10)
    assert resp.status_code == 200
    root = ET.fromstring(resp.content)  # noqa: S314 - our own test IdP's output
    assert root.tag == f"{{{NS['md']}}}EntityDescriptor"
    assert root.get("entityID") == idp.entity_id
    sso = root.find("md:IDPSSODescriptor/md:SingleSignOnService", NS)
    assert sso is not None and sso.get("Location") == idp.sso_url
    certs = {
        c.text.strip()
        for c in root.findall(
            "md:IDPSSODescriptor/md:KeyDescriptor[@use='signing']/ds:KeyInfo/ds:X509Data/ds:X509Certificate",
            NS,
        )
    }
    assert certs == {idp.x509_cert_b64}
    cert = x509.load_pem_x509_certificate(idp.x509_cert.encode())
    assert cert.not_valid_after_utc > dt.datetime.now(dt.UTC)


def test_saml_sp_initiated_flow(saml_idp):
    idp, user = saml_idp, SAML_USERS[0]
    sp_entity_id, acs_url = new_sp(idp)
    request_id, url = authn_request(idp, sp_entity_id=sp_entity_id, acs_url=acs_url)
    session = browser()
    page = saml_login(
        session,
        session.get(url, allow_redirects=False, timeout=10),
        user["username"],
        user["password"],
    )
    response, fields = saml_response_from(page, acs_url)
    assert fields["RelayState"] == "rs-42"

    assert response.tag == f"{{{NS['samlp']}}}Response"
    assert response.get("Destination") == acs_url
    assert response.get("InResponseTo") == request_id
    assert response.find("saml:Issuer", NS).text == idp.entity_id
    status = response.find("samlp:Status/samlp:StatusCode", NS)
    assert status.get("Value") == "urn:oasis:names:tc:SAML:2.0:status:Success"
    assert response.find("ds:Signature", NS) is not None  # response signed

    assertions = response.findall("saml:Assertion", NS)
    assert len(assertions) == 1
    assertion = assertions[0]
    signature = assertion.find("ds:Signature", NS)
    assert signature is not None  # assertion signed
    assert signature.find("ds:SignedInfo/ds:Reference", NS).get("URI") == f"#{assertion.get('ID')}"
    assert (
        signature.find("ds:SignedInfo/ds:SignatureMethod", NS).get("Algorithm")
        == "http://www.w3.org/2001/04/xmldsig-more#rsa-sha256"
    )
    signing_cert = signature.find("ds:KeyInfo/ds:X509Data/ds:X509Certificate", NS).text.strip()
    assert signing_cert == idp.x509_cert_b64

    name_id = assertion.find("saml:Subject/saml:NameID", NS)
    assert name_id.text == user["uid"]
    assert name_id.get("Format") == NAMEID_PERSISTENT
    confirmation = assertion.find(
        "saml:Subject/saml:SubjectConfirmation/saml:SubjectConfirmationData", NS
    )
    assert confirmation.get("Recipient") == acs_url
    assert confirmation.get("InResponseTo") == request_id
    audience = assertion.find("saml:Conditions/saml:AudienceRestriction/saml:Audience", NS)
    assert audience.text == sp_entity_id

    attrs = attributes(assertion)
    assert attrs["mail"] == [user["mail"]]
    assert attrs["uid"] == [user["uid"]]
    assert attrs["displayName"] == [user["displayName"]]
    assert attrs["eduPersonPrincipalName"] == [user["eduPersonPrincipalName"]]

    # Single sign-on: a second request in the same browser goes straight to the auto-POST form.
    request_id2, url2 = authn_request(idp, sp_entity_id=sp_entity_id, acs_url=acs_url)
    page2 = follow(session, session.get(url2, allow_redirects=False, timeout=10))
    response2, _ = saml_response_from(page2, acs_url)
    assert response2.get("InResponseTo") == request_id2


def test_saml_wrong_password(saml_idp):
    idp, user = saml_idp, SAML_USERS[1]
    sp_entity_id, acs_url = new_sp(idp)
    _request_id, url = authn_request(idp, sp_entity_id=sp_entity_id, acs_url=acs_url)
    session = browser()
    page = saml_login(
        session, session.get(url, allow_redirects=False, timeout=10), user["username"], "wrong"
    )
    assert "SAMLResponse" not in page.text
    form = only_form(page)
    assert "loginuserpass" in form["action"] and "password" in form["fields"]
    assert "Incorrect username or password" in page.text


def test_saml_unknown_sp_is_refused(saml_idp):
    idp = saml_idp
    _request_id, url = authn_request(
        idp, sp_entity_id=f"{PORTAL}/unknown/", acs_url=f"{PORTAL}/unknown/acs/"
    )
    resp = browser().get(url, allow_redirects=True, timeout=10)
    assert "SAMLResponse" not in resp.text
    assert "Metadata not found" in resp.text  # SimpleSAMLphp's error page (HTTP 200)


def test_saml_idp_initiated_with_uri_attribute_names(saml_idp_factory):
    user = SAML_USERS[1]
    sp_entity_id, acs_url = f"{PORTAL}/sp-uri/", f"{PORTAL}/sp-uri/acs/"
    idp = saml_idp_factory(
        host="127.0.0.6",
        users=[user],
        sp_entity_id=sp_entity_id,
        acs_url=acs_url,
        attribute_name_format="uri",
    )
    assert idp.startup_seconds < 15
    session = browser()
    start = session.get(
        idp.sso_url,
        params={"spentityid": sp_entity_id, "RelayState": "/next/"},
        allow_redirects=False,
        timeout=10,
    )
    page = saml_login(session, start, user["username"], user["password"])
    response, fields = saml_response_from(page, acs_url)
    assert fields["RelayState"] == "/next/"
    assert response.get("InResponseTo") is None  # unsolicited
    assertion = response.find("saml:Assertion", NS)
    assert assertion.find("ds:Signature", NS) is not None
    assert assertion.find("saml:Subject/saml:NameID", NS).text == user["uid"]
    attrs = attributes(assertion)
    assert attrs[OID["mail"]] == [user["mail"]]
    assert attrs[OID["eduPersonPrincipalName"]] == [user["eduPersonPrincipalName"]]
    name_formats = {
        a.get("NameFormat") for a in assertion.findall("saml:AttributeStatement/saml:Attribute", NS)
    }
    assert name_formats == {"urn:oasis:names:tc:SAML:2.0:attrname-format:uri"}

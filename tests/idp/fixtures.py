"""pytest fixtures for the real test IdPs. Load with ``pytest_plugins = ["tests.idp.fixtures"]`` in
the top-level ``tests/conftest.py``.

Session-scoped, one loopback address each (browsers key cookies by host, not port):

- ``oidc_idp_a``: oidc-provider on 127.0.0.2, "Institution A" (ACCOUNTS_A)
- ``oidc_idp_b``: oidc-provider on 127.0.0.3, "Institution B" (ACCOUNTS_B)
- ``saml_idp``:   SimpleSAMLphp on 127.0.0.4, "Institution C" (SAML_USERS)

They start with no client / SP: the portal's callback URL (OIDC) or SP entity id + ACS URL
(SAML) contain its provider id, which depends on the issuer / entity id, so register them once
the portal side is configured::

    oidc_idp_a.add_client("portal", "secret", [live_server.url + callback_path])
    saml_idp.add_sp(sp_entity_id, acs_url)

The ``*_factory`` fixtures start more (any loopback address, any accounts), stopped at session end.

The accounts are chosen for the identity rules: B's carol has the same ``sub`` as A's alice, and
B's mallory claims alice's e-mail address (verified) — a portal that keys identities on
(IdP, subject) keeps all three apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.idp.oidc import OIDCProvider, start_oidc_provider
from tests.idp.saml import SAMLIdP, start_saml_idp

OIDC_HOST_A = "127.0.0.2"
OIDC_HOST_B = "127.0.0.3"
SAML_HOST = "127.0.0.4"

ACCOUNTS_A = [
    {
        "sub": "a-1001",
        "login": "alice",
        "password": "alice-pass-A",
        "email": "alice@inst-a.example",
        "email_verified": True,
        "name": "Alice Anders",
    },
    {
        "sub": "a-1002",
        "login": "bob",
        "password": "bob-pass-A",
        "email": "bob@inst-a.example",
        "email_verified": False,
        "name": "Bob Berg",
    },
]
ACCOUNTS_B = [
    {
        "sub": "a-1001",  # same subject as A's alice: a different person at another IdP
        "login": "carol",
        "password": "carol-pass-B",
        "email": "carol@inst-b.example",
        "email_verified": True,
        "name": "Carol Conti",
    },
    {
        "sub": "b-2001",
        "login": "mallory",
        "password": "mallory-pass-B",
        "email": "alice@inst-a.example",  # claims A's alice's address
        "email_verified": True,
        "name": "Mallory Mayer",
    },
]
SAML_USERS = [
    {
        "username": "dave",
        "password": "dave-pass-C",
        "uid": "dave",
        "mail": "dave@inst-c.example",
        "displayName": "Dave Dietrich",
        "eduPersonPrincipalName": "dave@inst-c.example",
    },
    {
        "username": "erin",
        "password": "erin-pass-C",
        "uid": "erin",
        "mail": "erin@inst-c.example",
        "displayName": "Erin Eklund",
        "eduPersonPrincipalName": "erin@inst-c.example",
    },
]

OIDCFactory = Callable[..., OIDCProvider]
SAMLFactory = Callable[..., SAMLIdP]


@pytest.fixture(scope="session")
def oidc_provider_factory(tmp_path_factory) -> Iterator[OIDCFactory]:
    """``factory(*, host, clients=(), accounts=(), name=None, port=0) -> OIDCProvider``."""
    started: list[OIDCProvider] = []

    def factory(
        *,
        host: str,
        clients: list[dict] | tuple = (),
        accounts: list[dict] | tuple = (),
        name: str | None = None,
        port: int = 0,
    ) -> OIDCProvider:
        idp = start_oidc_provider(
            host=host,
            clients=list(clients),
            accounts=list(accounts),
            name=name,
            port=port,
            base_dir=tmp_path_factory.mktemp(f"oidc-{host}"),
        )
        started.append(idp)
        return idp

    yield factory
    for idp in started:
        idp.stop()


@pytest.fixture(scope="session")
def saml_idp_factory(tmp_path_factory) -> Iterator[SAMLFactory]:
    """``factory(*, host, users, sp_entity_id=None, acs_url=None, **start_saml_idp_kwargs) -> SAMLIdP``."""
    started: list[SAMLIdP] = []

    def factory(
        *,
        host: str,
        users: list[dict] | tuple,
        sp_entity_id: str | None = None,
        acs_url: str | None = None,
        **kwargs,
    ) -> SAMLIdP:
        idp = start_saml_idp(
            host=host,
            sp_entity_id=sp_entity_id,
            acs_url=acs_url,
            users=list(users),
            base_dir=tmp_path_factory.mktemp(f"saml-{host}"),
            **kwargs,
        )
        started.append(idp)
        return idp

    yield factory
    for idp in started:
        idp.stop()


@pytest.fixture(scope="session")
def oidc_idp_a(oidc_provider_factory) -> OIDCProvider:
    """Institution A's OpenID Connect provider on 127.0.0.2 (accounts: ACCOUNTS_A, no clients yet)."""
    return oidc_provider_factory(host=OIDC_HOST_A, accounts=ACCOUNTS_A, name="Institution A")


@pytest.fixture(scope="session")
def oidc_idp_b(oidc_provider_factory) -> OIDCProvider:
    """Institution B's OpenID Connect provider on 127.0.0.3 (accounts: ACCOUNTS_B, no clients yet)."""
    return oidc_provider_factory(host=OIDC_HOST_B, accounts=ACCOUNTS_B, name="Institution B")


@pytest.fixture(scope="session")
def saml_idp(saml_idp_factory) -> SAMLIdP:
    """Institution C's SAML 2.0 IdP on 127.0.0.4 (users: SAML_USERS, no SP yet)."""
    return saml_idp_factory(host=SAML_HOST, users=SAML_USERS)

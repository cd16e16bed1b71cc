"""A real OpenID Connect provider for tests: npm ``oidc-provider`` run by ``oidc_server.mjs``.

    from tests.idp.oidc import start_oidc_provider

    with start_oidc_provider(host="127.0.0.2", clients=[], accounts=[ALICE]) as idp:
        idp.add_client("portal", "s3cret", [callback_url])   # any time after the start
        ...  # idp.issuer, idp.discovery_url

Each provider listens on plain HTTP on its own loopback address (browsers key cookies by host, not
port, so two IdPs on one address would share cookies). Needs ``node`` and
``npm ci --prefix tests/idp`` (see README.md).
"""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.idp._process import (
    IDP_DIR,
    IdPStartError,
    log_tail,
    spawn,
    terminate,
    wait_until_ready,
    write_json_atomic,
)

SERVER_SCRIPT = IDP_DIR / "oidc_server.mjs"
NODE_MODULES = IDP_DIR / "node_modules" / "oidc-provider"

CLIENT_FIELDS = ("client_id", "client_secret", "redirect_uris")
ACCOUNT_FIELDS = ("sub", "password")


def _check_client(client: dict) -> dict:
    missing = [k for k in CLIENT_FIELDS if not client.get(k)]
    if missing:
        raise ValueError(f"OIDC client {client!r} lacks {missing}")
    if isinstance(client["redirect_uris"], str):
        raise ValueError("redirect_uris must be a list of URLs")
    return {"token_endpoint_auth_method": "client_secret_post", **client}


def _check_account(account: dict) -> dict:
    missing = [k for k in ACCOUNT_FIELDS if not account.get(k)]
    if missing:
        raise ValueError(f"OIDC account {account!r} lacks {missing}")
    return dict(account)


@dataclass
class OIDCProvider:
    """A running oidc-provider. ``stop()`` (or leaving the ``with`` block) kills it."""

    issuer: str
    host: str
    port: int
    name: str
    config_path: Path
    log_path: Path
    startup_seconds: float
    _proc: Any = field(repr=False)

    # --- URLs -----------------------------------------------------------------------------
    @property
    def discovery_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"

    @property
    def authorization_endpoint(self) -> str:
        return f"{self.issuer}/auth"

    @property
    def token_endpoint(self) -> str:
        return f"{self.issuer}/token"

    @property
    def userinfo_endpoint(self) -> str:
        return f"{self.issuer}/me"

    @property
    def jwks_uri(self) -> str:
        return f"{self.issuer}/jwks"

    # --- live configuration (re-read by the server on each lookup) ------------------------
    def _config(self) -> dict:
        return json.loads(self.config_path.read_text())

    @property
    def clients(self) -> list[dict]:
        return self._config()["clients"]

    @property
    def accounts(self) -> list[dict]:
        return self._config()["accounts"]

    def client(self, client_id: str) -> dict:
        for c in self.clients:
            if c["client_id"] == client_id:
                return c
        raise KeyError(client_id)

    def add_client(
        self,
        client_id: str,
        client_secret: str,
        redirect_uris: list[str],
        *,
        token_endpoint_auth_method: str = "client_secret_post",  # noqa: S107 - a method name
        **metadata: Any,
    ) -> dict:
        """Register (or replace) a confidential client; effective for the next request.

        oidc-provider 9 accepts the secret in the body (``client_secret_post``, allauth's choice
        when discovery offers both) or in HTTP Basic for either value of
        ``token_endpoint_auth_method``; ``private_key_jwt`` etc. would need more metadata.
        Extra ``metadata`` (e.g. ``post_logout_redirect_uris``) is passed to oidc-provider as is.
        """
        client = _check_client(
            {
                "client_id": client_id,
                "client_secret": client_secret,
                "redirect_uris": list(redirect_uris),
                "token_endpoint_auth_method": token_endpoint_auth_method,
                **metadata,
            }
        )
        config = self._config()
        config["clients"] = [c for c in config["clients"] if c["client_id"] != client_id] + [client]
        write_json_atomic(self.config_path, config)
        return client

    def remove_client(self, client_id: str) -> None:
        config = self._config()
        config["clients"] = [c for c in config["clients"] if c["client_id"] != client_id]
        write_json_atomic(self.config_path, config)

    def add_account(self, account: dict) -> dict:
        """Add (or replace, by ``sub``) an account: {sub, password, email, email_verified, name, login}."""
        account = _check_account(account)
        config = self._config()
        config["accounts"] = [a for a in config["accounts"] if a["sub"] != account["sub"]]
        config["accounts"].append(account)
        write_json_atomic(self.config_path, config)
        return account

    # --- lifecycle ------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def log(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def stop(self) -> None:
        terminate(self._proc)

    def __enter__(self) -> OIDCProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def node_executable() -> str:
    node = shutil.which("node")
    if node is None:
        raise IdPStartError("`node` is not on PATH (Node.js >= 20.19 is needed for oidc-provider)")
    if not NODE_MODULES.is_dir():
        raise IdPStartError(f"{NODE_MODULES} is missing: run `npm ci --prefix {IDP_DIR}`")
    return node


def start_oidc_provider(
    *,
    host: str,
    clients: list[dict],
    accounts: list[dict],
    port: int = 0,
    name: str | None = None,
    base_dir: Path | None = None,
    timeout: float = 30.0,
) -> OIDCProvider:
    """Start an oidc-provider on ``http://host:port`` (``port=0``: a free one) and wait for discovery.

    ``clients``: ``[{client_id, client_secret, redirect_uris, token_endpoint_auth_method?, …}]``
    (more can be added later with ``add_client``). ``accounts``: ``[{sub, password, email,
    email_verified, name, login?}]``; the login form accepts an account's ``login``, ``sub`` or
    ``email`` as the user name. Logs go to ``<base_dir>/oidc-server.log``.
    """
    node = node_executable()
    base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix=f"frp-oidc-{host}-"))
    base.mkdir(parents=True, exist_ok=True)
    config_path = base / "oidc-config.json"
    ready_path = base / "ready.json"
    log_path = base / "oidc-server.log"
    ready_path.unlink(missing_ok=True)
    config = {
        "host": host,
        "port": port,
        "name": name or f"Test IdP {host}",
        "ready_file": str(ready_path),
        "clients": [_check_client(c) for c in clients],
        "accounts": [_check_account(a) for a in accounts],
    }
    write_json_atomic(config_path, config)

    started = time.monotonic()
    proc = spawn([node, str(SERVER_SCRIPT), str(config_path)], log_path=log_path)
    deadline = started + timeout
    while not ready_path.exists():
        if proc.poll() is not None:
            raise IdPStartError(
                f"oidc-provider on {host} exited with code {proc.returncode}.\n"
                f"--- {log_path} ---\n{log_tail(log_path)}"
            )
        if time.monotonic() > deadline:
            terminate(proc)
            raise IdPStartError(
                f"oidc-provider on {host} did not start in {timeout:.0f} s.\n"
                f"--- {log_path} ---\n{log_tail(log_path)}"
            )
        time.sleep(0.05)
    ready = json.loads(ready_path.read_text())
    issuer = ready["issuer"]
    wait_until_ready(
        f"{issuer}/.well-known/openid-configuration",
        proc=proc,
        log_path=log_path,
        timeout=max(1.0, deadline - time.monotonic()),
        what=f"oidc-provider {issuer}",
    )
    return OIDCProvider(
        issuer=issuer,
        host=host,
        port=int(ready["port"]),
        name=config["name"],
        config_path=config_path,
        log_path=log_path,
        startup_seconds=time.monotonic() - started,
        _proc=proc,
    )


def new_client_secret() -> str:
    return secrets.token_urlsafe(24)

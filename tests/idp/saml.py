"""A real SAML 2.0 IdP for tests: Debian's SimpleSAMLphp 1.19 under PHP's built-in web server.

    from tests.idp.saml import start_saml_idp

    with start_saml_idp(host="127.0.0.4", sp_entity_id=sp, acs_url=acs, users=[ALICE]) as idp:
        ...  # idp.entity_id, idp.sso_url, idp.x509_cert (PEM), idp.metadata_url
        idp.add_sp(other_entity_id, other_acs_url)   # any time after the start

Each instance gets its own copy of ``tests/idp/simplesamlphp`` (config + metadata templates) plus a
``settings.json``, a fresh self-signed signing certificate, and its own session/log/temp folders.
Responses and assertions are signed (RSA-SHA256); the NameID is persistent, taken from the user's
``uid``. Needs ``apt-get install simplesamlphp php-cli php-xml php-mbstring`` (see README.md).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tests.idp._process import (
    IDP_DIR,
    IdPStartError,
    free_port,
    log_tail,
    spawn,
    terminate,
    wait_until_ready,
    write_json_atomic,
)

SIMPLESAMLPHP_DIR = Path("/usr/share/simplesamlphp")
SIMPLESAMLPHP_WWW = SIMPLESAMLPHP_DIR / "www"
TEMPLATE_DIR = IDP_DIR / "simplesamlphp"
ROUTER = TEMPLATE_DIR / "router.php"

NAMEID_PERSISTENT = "urn:oasis:names:tc:SAML:2.0:nameid-format:persistent"
NAMEID_EMAIL = "urn:oasis:names:tc:SAML:1.1:nameid-format:emailAddress"
NAMEID_TRANSIENT = "urn:oasis:names:tc:SAML:2.0:nameid-format:transient"

# Attribute names as they arrive with attribute_name_format="uri" (SimpleSAMLphp's name2oid map).
OID = {
    "uid": "urn:oid:0.9.2342.19200300.100.1.1",
    "mail": "urn:oid:0.9.2342.19200300.100.1.3",
    "displayName": "urn:oid:2.16.840.1.113730.3.1.241",
    "eduPersonPrincipalName": "urn:oid:1.3.6.1.4.1.5923.1.1.1.6",
    "givenName": "urn:oid:2.5.4.42",
    "sn": "urn:oid:2.5.4.4",
}


def make_self_signed_cert(common_name: str, days: int = 365) -> tuple[str, str]:
    """(certificate PEM, private key PEM): RSA 2048, SHA-256, valid from yesterday."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "FRP test IdP"),
        ]
    )
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ).decode()
    return cert_pem, key_pem


def _user_entry(user: dict) -> tuple[str, dict[str, list[str]]]:
    """{'username', 'password', <attribute>: str | list[str], ...} -> ('user:pass', attributes)."""
    username, password = user.get("username"), user.get("password")
    if not username or not password:
        raise ValueError(f"SAML user {user!r} needs 'username' and 'password'")
    if ":" in username:
        raise ValueError("a SAML test user name cannot contain ':' (exampleauth:UserPass)")
    attrs: dict[str, list[str]] = {}
    for key, value in user.items():
        if key in ("username", "password"):
            continue
        attrs[key] = [str(v) for v in value] if isinstance(value, list | tuple) else [str(value)]
    attrs.setdefault("uid", [username])
    return f"{username}:{password}", attrs


def _sp_entry(entity_id: str, acs_url: str, **extra: Any) -> dict:
    if not entity_id or not acs_url:
        raise ValueError("an SP needs entity_id and acs_url")
    return {"entity_id": entity_id, "acs_url": acs_url, **extra}


@dataclass
class SAMLIdP:
    """A running SimpleSAMLphp IdP. ``stop()`` (or leaving the ``with`` block) kills it."""

    entity_id: str
    sso_url: str
    slo_url: str
    metadata_url: str
    x509_cert: str  # PEM
    host: str
    port: int
    base_url: str
    instance_dir: Path
    log_path: Path  # PHP's built-in server (requests, PHP errors)
    ssp_log_path: Path  # SimpleSAMLphp's own log (DEBUG)
    startup_seconds: float
    _proc: Any = field(repr=False)

    @property
    def x509_cert_b64(self) -> str:
        """The certificate as bare base64 DER (what SAML metadata and python3-saml's ``x509cert`` hold)."""
        return "".join(
            line for line in self.x509_cert.strip().splitlines() if not line.startswith("-----")
        )

    @property
    def settings_path(self) -> Path:
        return self.instance_dir / "config" / "settings.json"

    def _settings(self) -> dict:
        return json.loads(self.settings_path.read_text())

    @property
    def sps(self) -> list[dict]:
        return self._settings()["sps"]

    def add_sp(
        self,
        entity_id: str,
        acs_url: str,
        *,
        slo_url: str | None = None,
        cert_pem: str | None = None,
        validate_authnrequest: bool = False,
    ) -> dict:
        """Register (or replace, by entity id) a service provider; effective for the next request."""
        sp = _sp_entry(
            entity_id,
            acs_url,
            slo_url=slo_url,
            cert_pem=cert_pem,
            validate_authnrequest=validate_authnrequest,
        )
        settings = self._settings()
        settings["sps"] = [s for s in settings["sps"] if s["entity_id"] != entity_id] + [sp]
        write_json_atomic(self.settings_path, settings)
        return sp

    def add_user(self, user: dict) -> None:
        """Add (or replace, by user name) a user: {'username', 'password', 'uid', 'mail', ...}."""
        key, attrs = _user_entry(user)
        settings = self._settings()
        username = key.split(":", 1)[0]
        settings["users"] = {
            k: v for k, v in settings["users"].items() if k.split(":", 1)[0] != username
        }
        settings["users"][key] = attrs
        write_json_atomic(self.settings_path, settings)

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def log(self, lines: int = 60) -> str:
        return f"{log_tail(self.log_path, lines)}\n--- simplesamlphp ---\n{log_tail(self.ssp_log_path, lines)}"

    def stop(self) -> None:
        terminate(self._proc)

    def __enter__(self) -> SAMLIdP:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def php_executable() -> str:
    php = shutil.which("php")
    if php is None:
        raise IdPStartError("`php` is not on PATH: apt-get install -y php-cli php-xml php-mbstring")
    if not (SIMPLESAMLPHP_WWW / "saml2" / "idp" / "SSOService.php").is_file():
        raise IdPStartError(
            f"SimpleSAMLphp is not in {SIMPLESAMLPHP_DIR}: apt-get install -y simplesamlphp"
        )
    return php


def start_saml_idp(
    *,
    host: str,
    sp_entity_id: str | None,
    acs_url: str | None,
    users: list[dict],
    port: int = 0,
    slo_url: str | None = None,
    sp_cert_pem: str | None = None,
    nameid_attribute: str = "uid",
    nameid_format: str = NAMEID_PERSISTENT,
    attribute_name_format: Literal["basic", "uri"] = "basic",
    base_dir: Path | None = None,
    timeout: float = 30.0,
) -> SAMLIdP:
    """Start SimpleSAMLphp as a SAML 2.0 IdP on ``http://host:port/`` and wait for its metadata.

    ``users``: ``[{"username", "password", "uid", "mail", "displayName", "eduPersonPrincipalName",
    ...}]``; every key but username/password becomes a (multi-valued if a list) attribute, ``uid``
    defaults to the user name. The SP (``sp_entity_id`` + ``acs_url``, HTTP-POST) may be left
    ``None`` and registered later with ``add_sp``. ``attribute_name_format="uri"`` sends
    ``urn:oid:…`` names (as R&S federations do) instead of the plain ones; the NameID is taken
    from ``nameid_attribute`` before that renaming. Logs: ``log_path`` and ``ssp_log_path``.
    """
    php = php_executable()
    if attribute_name_format not in ("basic", "uri"):
        raise ValueError("attribute_name_format must be 'basic' or 'uri'")
    base = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix=f"frp-saml-{host}-"))
    base.mkdir(parents=True, exist_ok=True)
    instance = base / "simplesamlphp"
    if instance.exists():
        shutil.rmtree(instance)
    shutil.copytree(TEMPLATE_DIR, instance, ignore=shutil.ignore_patterns("router.php"))
    dirs = {name: instance / name for name in ("cert", "log", "tmp", "data", "sessions")}
    for d in dirs.values():
        d.mkdir(mode=0o700, exist_ok=True)

    cert_pem, key_pem = make_self_signed_cert(host)
    (dirs["cert"] / "idp.crt").write_text(cert_pem)
    key_path = dirs["cert"] / "idp.key"
    key_path.touch(mode=0o600)
    key_path.write_text(key_pem)

    users_map = dict(_user_entry(u) for u in users)
    sps = (
        []
        if sp_entity_id is None and acs_url is None
        else [_sp_entry(sp_entity_id or "", acs_url or "", slo_url=slo_url, cert_pem=sp_cert_pem)]
    )
    log_path = base / "php-server.log"

    last_error: Exception | None = None
    for _attempt in range(3):  # php -S needs a concrete port: retry if another process took it
        chosen = port or free_port(host)
        base_url = f"http://{host}:{chosen}/"
        entity_id = f"{base_url}saml2/idp/metadata.php"
        settings = {
            "base_url": base_url,
            "idp_entity_id": entity_id,
            "secret_salt": secrets.token_urlsafe(32),
            "admin_password": secrets.token_urlsafe(16),
            "dirs": {
                "cert": f"{dirs['cert']}/",
                "log": f"{dirs['log']}/",
                "tmp": f"{dirs['tmp']}/",
                "data": f"{dirs['data']}/",
                "metadata": f"{instance / 'metadata'}/",
            },
            "users": users_map,
            "nameid_attribute": nameid_attribute,
            "nameid_format": nameid_format,
            "attribute_name_format": attribute_name_format,
            "sps": sps,
        }
        write_json_atomic(instance / "config" / "settings.json", settings)
        log_path.unlink(missing_ok=True)
        started = time.monotonic()
        php_ini = {
            "session.save_path": dirs["sessions"],  # this instance's sessions only
            "session.gc_probability": 0,
            "display_errors": "stderr",  # PHP errors into the server log, not into pages
            "log_errors": "On",
        }
        ini_args = [arg for k, v in php_ini.items() for arg in ("-d", f"{k}={v}")]
        proc = spawn(
            [php, *ini_args, "-S", f"{host}:{chosen}", "-t", str(SIMPLESAMLPHP_WWW), str(ROUTER)],
            log_path=log_path,
            env={
                "SIMPLESAMLPHP_CONFIG_DIR": str(instance / "config"),
                "PHP_CLI_SERVER_WORKERS": "4",
            },
        )
        try:
            wait_until_ready(
                entity_id,
                proc=proc,
                log_path=log_path,
                timeout=timeout,
                what=f"SimpleSAMLphp on {host}:{chosen}",
            )
        except IdPStartError as exc:
            last_error = exc
            terminate(proc)
            if port or "Address already in use" not in log_tail(log_path):
                raise
            continue
        return SAMLIdP(
            entity_id=entity_id,
            sso_url=f"{base_url}saml2/idp/SSOService.php",
            slo_url=f"{base_url}saml2/idp/SingleLogoutService.php",
            metadata_url=entity_id,
            x509_cert=cert_pem,
            host=host,
            port=chosen,
            base_url=base_url,
            instance_dir=instance,
            log_path=log_path,
            ssp_log_path=dirs["log"] / "simplesamlphp.log",
            startup_seconds=time.monotonic() - started,
            _proc=proc,
        )
    raise IdPStartError(f"SimpleSAMLphp could not get a port on {host}") from last_error


def decode_cert_der(pem: str) -> bytes:
    body = "".join(line for line in pem.strip().splitlines() if not line.startswith("-----"))
    return base64.b64decode(body)

"""The platform's certificate authority: TLS certificates for the SuperLink and the portal.

Django-free (the local runtime, the management command and tests use it). A CA is a directory with
``ca.crt`` (PEM, self-signed, ECDSA P-384, ``BasicConstraints(ca=True, path_length=0)``) and
``ca.key`` (PEM PKCS#8, mode 0600). ``server_certificate_issue`` signs a leaf for the names a
client dials (DNS names and IP addresses, all as subjectAltName: RFC 6125 §6.4 — clients ignore
the common name), ``serverAuth`` only, valid 825 days (the CA/Browser Forum's former limit).

An institution that runs its own CA hands the platform admin ``ca.crt`` and a SuperLink
certificate it signed instead; nothing here is then used. Every file is written 0600 in a 0700
directory; an existing file is never overwritten unless ``replace=True``.

Raises ``PkiError`` for an unreadable or mismatched CA, or a name that is neither a DNS name nor an
IP address.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 825
_DNS = re.compile(
    r"(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
)


class PkiError(Exception):
    """A CA or certificate could not be made or read."""


@dataclass(frozen=True)
class CertificateAuthority:
    """A CA on disk: ``cert`` (PEM certificate) and ``key`` (PEM private key)."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class ServerCertificate:
    """A TLS server certificate (``cert``, PEM) and its private key (``key``, PEM, 0600)."""

    cert: Path
    key: Path
    names: tuple[str, ...]


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def _write(path: Path, data: bytes, *, replace: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError as exc:
        raise PkiError(f"{path} exists; not overwritten") from exc
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def ca_create(
    directory: Path, *, common_name: str = "Federated Research Portal CA", replace: bool = False
) -> CertificateAuthority:
    """Make a new CA in ``directory`` (``ca.crt``, ``ca.key``); valid ``CA_DAYS`` days."""
    directory = _private_dir(Path(directory))
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    ca = CertificateAuthority(cert=directory / "ca.crt", key=directory / "ca.key")
    _write(ca.key, _key_pem(key), replace=replace)
    _write(ca.cert, cert.public_bytes(serialization.Encoding.PEM), replace=replace)
    return ca


def ca_load_or_create(directory: Path) -> CertificateAuthority:
    """The CA in ``directory``, made on first use."""
    directory = Path(directory)
    ca = CertificateAuthority(cert=directory / "ca.crt", key=directory / "ca.key")
    if ca.cert.is_file() and ca.key.is_file():
        _load(ca)  # checks it
        return ca
    return ca_create(directory)


def _load(ca: CertificateAuthority) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
        key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise PkiError(f"cannot read the CA in {ca.cert.parent}: {exc}") from exc
    if cert.public_key().public_numbers() != key.public_key().public_numbers():
        raise PkiError(f"{ca.key} is not the key of {ca.cert}")
    return cert, key


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        if not _DNS.fullmatch(name):
            raise PkiError(f"{name!r} is neither a DNS name nor an IP address") from None
        return x509.DNSName(name)


def server_certificate_issue(
    ca: CertificateAuthority,
    directory: Path,
    *,
    name: str,
    hosts: list[str],
    replace: bool = False,
) -> ServerCertificate:
    """Sign a server certificate for ``hosts`` (DNS names / IPs) as ``<directory>/<name>.crt``
    with its key ``<name>.key``; valid ``LEAF_DAYS`` days."""
    if not hosts:
        raise PkiError("a server certificate needs at least one host name or address")
    names = tuple(dict.fromkeys(hosts))  # de-duplicated, order kept
    sans = [_san(h) for h in names]
    ca_cert, ca_key = _load(ca)
    directory = _private_dir(Path(directory))
    key = ec.generate_private_key(ec.SECP384R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA384())
    )
    out = ServerCertificate(
        cert=directory / f"{name}.crt", key=directory / f"{name}.key", names=names
    )
    _write(out.key, _key_pem(key), replace=replace)
    _write(out.cert, cert.public_bytes(serialization.Encoding.PEM), replace=replace)
    return out


def certificate_names(cert: Path) -> list[str]:
    """The subjectAltNames (DNS names and IP addresses, as text) of the PEM certificate ``cert``."""
    try:
        parsed = x509.load_pem_x509_certificate(Path(cert).read_bytes())
        ext = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound) as exc:
        raise PkiError(f"cannot read the names of {cert}: {exc}") from exc
    return [str(v) for v in ext.get_values_for_type(x509.DNSName)] + [
        str(v) for v in ext.get_values_for_type(x509.IPAddress)
    ]

"""Make the certificates and key files docker-compose.yml mounts, readable by its containers.

    sudo python scripts/compose_certs.py portal --host portal.example.org [--superlink-name NAME]...
    sudo python scripts/compose_certs.py site hospital-a [--kit /etc/frp-site]

Compose bind-mounts configs and secrets with the host file's owner and mode (uid/gid/mode apply
only under Swarm), so this writes every certificate 0644 and every private key 0600, owned by the
user that reads it: uid 10001 (the image's ``frp`` user: superlink, supernodes) or root (nginx,
MinIO). Hence root (``sudo``). Below ``--dir`` (default: this repository):

``portal`` (the portal's host): the platform CA in ``pki/`` (``ca.key`` never leaves it: 0700,
never mounted), ``certs/ca.crt``, ``certs/superlink.{crt,key}`` (names: the public host, every
``--superlink-name``, ``superlink``, ``localhost``, 127.0.0.1) and ``certs/portal.{crt,key}`` (the
public host, ``localhost``; nginx serves it to browsers, site tools and the ServerApp's callbacks).

``site SITE`` (a site's host): the site's own store CA in ``pki/SITE/`` and its MinIO certificate
``certs/SITE/{ca.crt,minio.crt,minio.key}`` (names ``minio-SITE``, ``localhost``, 127.0.0.1).
With ``--kit`` (a kit after ``frp-site enroll``): ``keys/SITE`` (the kit's ``supernode.key``),
``keys/SITE.kek`` (``keyring/SITE.kek``) and ``certs/ca.crt`` (the kit's ``ca.crt``).

An existing CA is reused; an existing certificate is not replaced unless ``--replace``. Exits 2
(with the reason) when not root, when a kit file is missing or a name is invalid.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from federation import pki  # noqa: E402  (Django-free)

IMAGE_UID = 10001  # Dockerfile: the frp user
ROOT_UID = 0


def _install(data: bytes, dest: Path, *, mode: int, uid: int) -> None:
    """Write ``data`` to ``dest`` with ``mode`` and owner ``uid`` (group: same id)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chown(dest, uid, uid)
    os.chmod(dest, mode)
    print(f"{dest}  {mode:04o} uid {uid}")


def _public_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o755)  # noqa: S103  (public certificates only; keys are 0600 files)
    return path


def _leaf(ca, private: Path, name: str, hosts: list[str], replace: bool):
    cert = private / f"{name}.crt"
    if cert.exists() and not replace:
        return pki.ServerCertificate(
            cert=cert, key=private / f"{name}.key", names=tuple(pki.certificate_names(cert))
        )
    return pki.server_certificate_issue(ca, private, name=name, hosts=hosts, replace=replace)


def portal(out: Path, *, host: str, superlink_names: list[str], replace: bool) -> None:
    """The portal host's files (see module doc). Raises ``pki.PkiError``."""
    private = out / "pki"
    certs = _public_dir(out / "certs")
    ca = pki.ca_load_or_create(private)
    superlink = _leaf(
        ca,
        private,
        "superlink",
        [host, *superlink_names, "superlink", "localhost", "127.0.0.1"],
        replace,
    )
    portal_cert = _leaf(ca, private, "portal", [host, "localhost"], replace)
    _install(ca.cert.read_bytes(), certs / "ca.crt", mode=0o644, uid=ROOT_UID)
    _install(superlink.cert.read_bytes(), certs / "superlink.crt", mode=0o644, uid=ROOT_UID)
    _install(superlink.key.read_bytes(), certs / "superlink.key", mode=0o600, uid=IMAGE_UID)
    _install(portal_cert.cert.read_bytes(), certs / "portal.crt", mode=0o644, uid=ROOT_UID)
    _install(portal_cert.key.read_bytes(), certs / "portal.key", mode=0o600, uid=ROOT_UID)


def site(out: Path, slug: str, *, kit: Path | None, replace: bool) -> None:
    """A site host's files (see module doc). Raises ``pki.PkiError``, ``FileNotFoundError``."""
    private = out / "pki" / slug
    certs = _public_dir(out / "certs")
    site_certs = _public_dir(certs / slug)
    if kit is not None:
        node_key = (kit / "supernode.key").read_bytes()
        kek = (kit / "keyring" / f"{slug}.kek").read_bytes()
        federation_ca = (kit / "ca.crt").read_bytes()
    ca = pki.ca_load_or_create(private)
    store = _leaf(ca, private, "minio", [f"minio-{slug}", "localhost", "127.0.0.1"], replace)
    _install(ca.cert.read_bytes(), site_certs / "ca.crt", mode=0o644, uid=ROOT_UID)
    _install(store.cert.read_bytes(), site_certs / "minio.crt", mode=0o644, uid=ROOT_UID)
    _install(store.key.read_bytes(), site_certs / "minio.key", mode=0o600, uid=ROOT_UID)
    if kit is not None:
        keys = out / "keys"
        keys.mkdir(exist_ok=True)
        os.chmod(keys, 0o700)
        _install(federation_ca, certs / "ca.crt", mode=0o644, uid=ROOT_UID)
        _install(node_key, keys / slug, mode=0o600, uid=IMAGE_UID)
        _install(kek, keys / f"{slug}.kek", mode=0o600, uid=IMAGE_UID)


def main(argv: list[str] | None = None) -> int:
    """Command line (see module doc); returns the exit status."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", type=Path, default=ROOT, help="next to docker-compose.yml")
    common.add_argument("--replace", action="store_true", help="issue certificates again")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "portal", parents=[common], help="the portal host's CA, SuperLink and portal certificates"
    )
    p.add_argument("--host", required=True, help="the portal's public host name (FRP_PUBLIC_HOST)")
    p.add_argument("--superlink-name", action="append", default=[], help="another SuperLink name")
    s = sub.add_parser(
        "site", parents=[common], help="a site host's MinIO certificate, and its kit's keys"
    )
    s.add_argument("slug", help="the site id, e.g. hospital-a")
    s.add_argument("--kit", type=Path, help="the site's kit folder, after `frp-site enroll`")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(
            "compose_certs.py: run as root (sudo): the keys are given to uid 10001 and root",
            file=sys.stderr,
        )
        return 2
    try:
        if args.command == "portal":
            portal(
                args.dir, host=args.host, superlink_names=args.superlink_name, replace=args.replace
            )
        else:
            site(args.dir, args.slug, kit=args.kit, replace=args.replace)
    except (pki.PkiError, OSError) as exc:
        print(f"compose_certs.py: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

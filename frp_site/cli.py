"""``frp-site``: the site operator's tool (imports no Django).

Every command reads the unpacked site kit (``--kit DIR``, default ``$FRP_SITE_KIT`` or the current
folder; ``frp_site.config``):

- ``enroll`` (first) makes the SuperNode key pair (once) and the site's key-encryption key (once)
  here, and sends the portal only the public key; the portal registers it with the SuperLink.
- ``doctor`` checks the kit's files and their modes, the CA certificate, the SuperNode key, the
  keyring, that the SuperLink answers TLS with a certificate the CA signed for its address, and
  that the portal answers over HTTPS and accepts the site's credential. Exit 1 if a check fails.
  Before ``enroll`` it reports one failure, "not enrolled yet: run `frp-site enroll`".
- ``supernode`` runs the SuperNode (``flower-supernode``: TLS with the kit's CA, authenticated
  by the site's key, the node config naming this site's store and keyring); ``--print`` shows the
  command line instead.
- ``ingest CSV --dataset SLUG --title …`` encrypts the CSV into the site's store with the site's
  key (``sandbox.ingest``) and sends the portal only its metadata and suppressed profile.
- ``key rotate`` makes a new key-encryption key, re-wraps every registered object's data key (no
  data re-encrypted), reports the new object hashes, then deletes the old key.
- ``status`` prints what the portal knows of the site.

``--insecure-development`` lets the tool talk to a plain-HTTP portal and the SuperNode dial a
SuperLink without TLS: development only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import socket
import ssl
import stat
import sys
from pathlib import Path

from frp_site import config as site_config
from frp_site import nodekey, supernode
from frp_site.portal_api import PortalClient, PortalError

EXIT_FAIL = 1


class CommandError(Exception):
    """A command could not do its work; the message is for the operator."""


# ---------------------------------------------------------------------------------------------
# doctor
# ---------------------------------------------------------------------------------------------


def _check_private(path: Path, what: str) -> str:
    if not path.exists():
        raise CommandError(f"{what} {path} does not exist")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise CommandError(f"{what} {path} has mode {mode:04o}: make it 0600 (chmod 600)")
    return f"{what} {path} (mode {mode:04o})"


def _tls_probe(address: str, cafile: Path, timeout: float = 10.0) -> str:
    """Handshake with ``address`` (``host:port``), verifying the chain and the host name."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    ctx = ssl.create_default_context(cafile=str(cafile))
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=host) as tls,
        ):
            return f"TLS {tls.version()} to {address}, certificate verified for {host}"
    except ssl.SSLCertVerificationError as exc:
        raise CommandError(f"{address}: certificate not trusted: {exc.verify_message}") from exc
    except (OSError, ValueError) as exc:
        raise CommandError(f"{address} does not answer TLS: {exc}") from exc


def doctor(cfg: site_config.SiteConfig, *, allow_http: bool, out) -> int:
    """Run every check; print one line each; return the number that failed."""
    from cryptography import x509

    checks = []

    def ca():
        try:
            cert = x509.load_pem_x509_certificate(cfg.superlink_ca.read_bytes())
        except (OSError, ValueError) as exc:
            raise CommandError(f"CA certificate {cfg.superlink_ca}: {exc}") from exc
        return f"CA certificate {cert.subject.rfc4514_string()}, valid until {cert.not_valid_after_utc:%Y-%m-%d}"

    def credential():
        _check_private(cfg.credential_file, "site credential")
        if not cfg.credential().startswith("frps_"):
            raise CommandError(f"{cfg.credential_file} holds no site credential")
        return f"site credential {cfg.credential_file}"

    def key():
        if not cfg.supernode_key.exists():
            raise CommandError(f"no SuperNode key at {cfg.supernode_key}: run `frp-site enroll`")
        _check_private(cfg.supernode_key, "SuperNode key")
        return f"SuperNode key {nodekey.fingerprint(nodekey.public_key_of(cfg.supernode_key))}"

    def keyring():
        from sandbox.keyring import SiteKeyring

        ring = SiteKeyring(cfg.keyring_dir)
        if not ring.exists(cfg.site):
            raise CommandError(f"no key-encryption key in {cfg.keyring_dir}: run `frp-site enroll`")
        ring.get(cfg.site)  # checks mode and length
        return f"key-encryption key of {cfg.site} in {cfg.keyring_dir}"

    def store():
        from sandbox.storage import store_from_url

        s = store_from_url(cfg.store_url)
        if hasattr(s, "check"):
            s.check()
        return f"object store {s.url}"

    def link():
        return "SuperLink: " + _tls_probe(cfg.superlink, cfg.superlink_ca)

    def portal():
        answer = PortalClient(cfg, allow_http=allow_http).status()
        return f"portal {cfg.portal_url} accepts site {answer['site']}; SuperNode {answer['supernode']['state']}"

    def enrolled():
        raise CommandError(
            "not enrolled yet: run `frp-site enroll` (it makes the SuperNode key pair and the "
            "key-encryption key here)"
        )

    from sandbox.keyring import SiteKeyring

    fresh = not cfg.supernode_key.exists() and not SiteKeyring(cfg.keyring_dir).exists(cfg.site)
    # A kit not enrolled yet fails once, with what to do; a half-done enrolment names its gap.
    keys = [enrolled] if fresh else [key, keyring]
    checks = [ca, credential, *keys, store, link, portal]
    failed = 0
    for check in checks:
        try:
            print(f"ok    {check()}", file=out)
        except (CommandError, PortalError, nodekey.NodeKeyError, OSError, ValueError) as exc:
            failed += 1
            print(f"FAIL  {exc}", file=out)
        except Exception as exc:  # noqa: BLE001 — a check must not hide the others
            failed += 1
            print(f"FAIL  {check.__name__}: {type(exc).__name__}: {exc}", file=out)
    print(f"{len(checks) - failed} of {len(checks)} checks passed", file=out)
    return failed


# ---------------------------------------------------------------------------------------------
# enroll, supernode, status
# ---------------------------------------------------------------------------------------------


def enroll(cfg: site_config.SiteConfig, *, allow_http: bool, out) -> dict:
    """Make the SuperNode key pair and the KEK if missing; upload the public key."""
    from sandbox.keyring import SiteKeyring

    os.chmod(cfg.kit_dir, 0o700)
    if cfg.credential_file.exists():
        os.chmod(cfg.credential_file, 0o600)
    if cfg.supernode_key.exists():
        public = nodekey.public_key_of(cfg.supernode_key)
        print(f"Using the SuperNode key {cfg.supernode_key}", file=out)
    else:
        public = nodekey.key_pair_create(cfg.supernode_key, comment=cfg.site)
        print(f"Made the SuperNode key pair {cfg.supernode_key} (+ .pub)", file=out)
    ring = SiteKeyring(cfg.keyring_dir)
    if not ring.exists(cfg.site):
        ring.create(cfg.site)
        print(f"Made the key-encryption key of {cfg.site} in {cfg.keyring_dir}", file=out)
    answer = PortalClient(cfg, allow_http=allow_http).supernode_key(public)
    print(
        f"The portal registered SuperNode {answer['node_id']} (key {answer['fingerprint']}); "
        "start it with `frp-site supernode`.",
        file=out,
    )
    return answer


def supernode_command(
    cfg: site_config.SiteConfig, *, insecure: bool, port: int | None
) -> list[str]:
    """The ``flower-supernode`` command line of this site."""
    exe = Path(sys.executable).with_name("flower-supernode")
    return supernode.command(
        cfg.superlink,
        node_config=cfg.node_config(),
        ca_cert=None if insecure else cfg.superlink_ca,
        auth_key=cfg.supernode_key,
        port=port,
        executable=str(exe)
        if exe.exists()
        else (shutil.which("flower-supernode") or "flower-supernode"),
        insecure=insecure,
    )


# ---------------------------------------------------------------------------------------------
# ingest and key rotation
# ---------------------------------------------------------------------------------------------


def ingest(
    cfg: site_config.SiteConfig,
    csv_path: Path,
    *,
    dataset: str,
    title: str,
    description: str,
    missing_values: list[str],
    allow_http: bool,
    out,
) -> dict:
    """Encrypt ``csv_path`` into the site's store; register its metadata and profile."""
    from sandbox.ingest import ingest_csv, store_key_for
    from sandbox.keyring import SiteKeyring
    from sandbox.storage import store_from_url

    client = PortalClient(cfg, allow_http=allow_http)
    version = client.next_version(dataset)
    store = store_from_url(cfg.store_url)
    ring = SiteKeyring(cfg.keyring_dir)
    kek = ring.get(cfg.site) if ring.exists(cfg.site) else ring.create(cfg.site)
    key = store_key_for(site=cfg.site, dataset=dataset, version=version)
    if store.exists(key):  # never registered (the portal gave this version): a crashed ingest's
        store.delete(key)
    result = ingest_csv(
        csv_path,
        site=cfg.site,
        dataset=dataset,
        version=version,
        store=store,
        kek=kek,
        missing_values=missing_values,
    )
    body = {
        "dataset": dataset,
        "title": title,
        "description": description,
        "version": version,
        "result": {**dataclasses.asdict(result), "missing_values": list(result.missing_values)},
    }
    try:
        answer = client.dataset_register(body)
    except PortalError:
        store.delete(result.store_key)  # nothing registered: nothing kept
        raise
    print(
        f"Registered {cfg.site}/{dataset} version {version}: {result.row_count} rows, "
        f"{len(result.schema)} columns, {result.size_bytes} bytes encrypted in {store.url}",
        file=out,
    )
    return answer


def key_rotate(cfg: site_config.SiteConfig, *, allow_http: bool, out) -> int:
    """Rotate the KEK; re-wrap and report every registered object; retire the old key.

    Run it again after an interruption: it finishes the rotation. Returns the count re-wrapped.
    """
    from sandbox.crypto import associated_data
    from sandbox.keyring import KeyringError, SiteKeyring, rewrap_object
    from sandbox.storage import store_from_url

    client = PortalClient(cfg, allow_http=allow_http)
    versions = client.versions()
    store = store_from_url(cfg.store_url)
    ring = SiteKeyring(cfg.keyring_dir)
    previous = ring.previous(cfg.site)
    if not previous:
        ring.rotate(cfg.site)
        previous = ring.previous(cfg.site)
    new = ring.get(cfg.site)
    olds = [ring.get_previous(cfg.site, n) for n in reversed(previous)]
    changed = 0
    for v in versions:
        aad = associated_data(site=cfg.site, dataset=v["dataset"], version=v["version"])
        error = None
        for old in olds:
            try:
                res = rewrap_object(store, v["store_key"], old_kek=old, new_kek=new, aad=aad)
                break
            except KeyringError as exc:
                error = exc
        else:
            raise CommandError(f"{v['store_key']}: {error}")
        changed += res.changed
        if (res.size_bytes, res.ciphertext_sha256) != (v["size_bytes"], v["ciphertext_sha256"]):
            client.version_object(
                v["id"], size_bytes=res.size_bytes, ciphertext_sha256=res.ciphertext_sha256
            )
    for n in previous:
        ring.retire(cfg.site, n)
    print(
        f"Rotated the key of {cfg.site}: {changed} object(s) re-wrapped, "
        f"{len(versions) - changed} already under the new key; old key(s) deleted.",
        file=out,
    )
    return changed


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="frp-site", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--kit",
        type=Path,
        default=Path(os.environ.get("FRP_SITE_KIT", ".")),
        help="the unpacked site kit (default: $FRP_SITE_KIT or the current folder)",
    )
    p.add_argument(
        "--insecure-development",
        action="store_true",
        help="DEVELOPMENT ONLY: allow a plain-HTTP portal and a SuperLink without TLS",
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("doctor", help="check the kit, keys, certificates and connectivity")
    sub.add_parser("enroll", help="make the key pair and send the portal the public key")
    sn = sub.add_parser("supernode", help="run this site's SuperNode")
    sn.add_argument("--print", action="store_true", help="print the command line, do not run it")
    sn.add_argument("--port", type=int, default=None, help="the SuperNode's local runtime port")
    ing = sub.add_parser("ingest", help="encrypt a CSV here and register its metadata")
    ing.add_argument("csv", type=Path)
    ing.add_argument("--dataset", required=True, help="the dataset's id (slug)")
    ing.add_argument("--title", default="", help="the dataset's title (needed for a new one)")
    ing.add_argument("--description", default="")
    ing.add_argument(
        "--missing-values", default="", help="comma-separated missing-value markers (e.g. NA)"
    )
    key = sub.add_parser("key", help="the site's key-encryption key")
    key.add_argument("action", choices=["rotate"])
    sub.add_parser("status", help="what the portal knows of this site")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run ``frp-site``; return its exit status."""
    args = _parser().parse_args(argv)
    out = sys.stdout
    allow_http = args.insecure_development
    try:
        cfg = site_config.load(args.kit)
        if args.command == "doctor":
            return EXIT_FAIL if doctor(cfg, allow_http=allow_http, out=out) else 0
        if args.command == "enroll":
            enroll(cfg, allow_http=allow_http, out=out)
        elif args.command == "supernode":
            cmd = supernode_command(cfg, insecure=allow_http, port=args.port)
            if args.print:
                print(json.dumps(cmd), file=out)
                return 0
            env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0")
            env.setdefault("FLWR_HOME", str(cfg.kit_dir / "flwr-home"))
            env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
            os.execve(cmd[0], cmd, env)  # noqa: S606 — our own fixed command line
        elif args.command == "ingest":
            markers = [m.strip() for m in args.missing_values.split(",") if m.strip()]
            ingest(
                cfg,
                args.csv,
                dataset=args.dataset,
                title=args.title,
                description=args.description,
                missing_values=["", *markers],
                allow_http=allow_http,
                out=out,
            )
        elif args.command == "key":
            key_rotate(cfg, allow_http=allow_http, out=out)
        elif args.command == "status":
            print(json.dumps(PortalClient(cfg, allow_http=allow_http).status(), indent=2), file=out)
    except Exception as exc:  # noqa: BLE001 — the operator gets one line, not a traceback
        from sandbox.ingest import IngestError
        from sandbox.keyring import KeyringError
        from sandbox.storage import StorageError

        known = (
            site_config.ConfigError,
            CommandError,
            PortalError,
            nodekey.NodeKeyError,
            IngestError,
            KeyringError,
            StorageError,
        )
        if not isinstance(exc, known):
            raise
        print(f"frp-site {args.command}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    return 0


if __name__ == "__main__":
    sys.exit(main())

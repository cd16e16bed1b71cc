"""Onboarding by site kit: the federation's services and selector for a site's SuperNode.

1. An institution admin adds a site (``portal.sites.site_create``) and downloads its kit
   (``site_kit``): ``site.toml`` (site id, portal URL, SuperLink address), ``ca.crt`` (verifies the
   SuperLink and the portal), ``credential`` (the site tool's own credential, shown only here) and
   ``README.md`` (the steps). The kit holds no key: the site makes its SuperNode key pair itself
   (``frp-site enroll``) and uploads only the public key.
2. ``site_node_key_submit`` registers that public key with the SuperLink
   (``flwr supernode register``; the SuperLink runs with ``--enable-supernode-auth``, so an
   unregistered key is refused) and records the node id (``SiteNode``).
3. ``site_node_unregister`` unregisters it (``flwr supernode unregister``); revoking a site
   (``portal.sites.site_revoke``) does so through ``on_site_revoked``.
4. ``site_nodes_state`` is what the admin pages show: each site's key, and the SuperLink's view of
   its SuperNode (registered, online, offline; last seen).

Raises ``OnboardingError`` with a message for the user; ``SuperLinkError`` is turned into it.
"""

from __future__ import annotations

import io
import json
import logging
import zipfile
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path

from celery import signature
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from federation import superlink
from federation.models import SiteNode, SiteNodeStatus
from frp_site import nodekey
from portal.models import Site
from portal.services import audit_record
from portal.sites import site_credential_issue

log = logging.getLogger(__name__)


class OnboardingError(Exception):
    """A kit could not be made, or a key could not be registered or unregistered."""


def _connection() -> superlink.Connection:
    from federation.services import superlink_connection

    return superlink_connection()


def superlink_public_address() -> str:
    """The SuperLink address a site's SuperNode dials (``host:port``).

    ``FRP_SUPERLINK_PUBLIC_ADDRESS``, else the local federation's Fleet address (its Fleet
    gateway's when other hosts reach it: never the SuperLink's own port, which also serves the
    Control API; ADR 0033). Raises ``OnboardingError``.
    """
    if settings.FRP_SUPERLINK_PUBLIC_ADDRESS:
        return settings.FRP_SUPERLINK_PUBLIC_ADDRESS
    from federation import runtime

    try:
        return runtime.load_state(settings.VAR_DIR / "federation").fleet_address
    except runtime.RuntimeError_ as exc:
        raise OnboardingError(
            "no SuperLink address to give sites: set FRP_SUPERLINK_PUBLIC_ADDRESS, or start the "
            "local federation"
        ) from exc


def _ca_pem(path) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OnboardingError(f"the CA certificate {path} cannot be read: {exc}") from exc


def _kit_toml(site: Site, address: str) -> str:
    q = json.dumps  # a JSON string is a valid TOML basic string
    return (
        "# Site kit of the Federated Research Portal: read README.md.\n"
        "[site]\n"
        f"id = {q(site.slug)}\n"
        f"name = {q(site.name)}\n"
        f"institution = {q(site.institution.name)}\n\n"
        "[portal]\n"
        f"url = {q(settings.FRP_PORTAL_URL.rstrip('/'))}\n"
        'ca-certificate = "ca.crt"\n'
        'credential = "credential"\n\n'
        "[superlink]\n"
        f"address = {q(address)}\n"
        'ca-certificate = "ca.crt"\n\n'
        "# Where this site keeps its data and keys (relative paths: beside this file).\n"
        "[storage]\n"
        'store = "store"\n'
        'keyring = "keyring"\n'
        'supernode-key = "supernode.key"\n'
    )


_README = """# Site kit for {name} (site id `{slug}`)

This kit joins your host to the Federated Research Portal at {portal}. It holds no key: your
SuperNode's key pair and your data's key-encryption key are made on your host and never leave it.

Keep `credential` secret (it is your site tool's credential, shown only in this kit; a new kit
replaces it). Everything else here is public.

1. Install the site package (Python 3.11, no Django needed):
       python3.11 -m venv /opt/frp-site && /opt/frp-site/bin/pip install frp_site-*.whl
2. Unpack this kit in a folder only the site's service account can read (mode 0700). Make your
   SuperNode key pair and your data's key-encryption key, and send the portal the public key (only
   the public key leaves):
       frp-site --kit DIR enroll
   The portal registers it with the SuperLink; a SuperNode with any other key is refused.
3. Check the host:
       frp-site --kit DIR doctor
   `doctor` checks the certificates, that the SuperLink ({address}) and the portal answer over TLS,
   and the permissions of your keys (before `enroll` it says only "not enrolled yet").
4. Start your SuperNode (keep it running, e.g. as a systemd service):
       frp-site --kit DIR supernode
5. Register a dataset: it is encrypted here with your site's key; the portal receives only its
   metadata and a profile with small counts suppressed:
       frp-site --kit DIR ingest data.csv --dataset SLUG --title "Title"
6. `frp-site --kit DIR status` shows what the portal knows of your site; `frp-site --kit DIR key
   rotate` rotates your key-encryption key (no data is re-encrypted).

If your institution revokes the site on the portal, the SuperLink refuses your SuperNode.
"""


def site_kit(*, by, site: Site) -> bytes:
    """The site kit of ``site`` as a ZIP archive (see module doc); issues a new site credential
    (revoking the previous one). Raises ``OnboardingError`` (revoked site, no SuperLink address,
    unreadable CA)."""
    if site.is_revoked:
        raise OnboardingError(f"site {site.slug} is revoked")
    address = superlink_public_address()
    ca = _ca_pem(settings.FRP_FEDERATION_CA_FILE)
    portal_ca = _ca_pem(settings.FRP_PORTAL_CA_FILE) if settings.FRP_PORTAL_CA_FILE else b""
    token = site_credential_issue(by=by, site=site)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("site.toml", _kit_toml(site, address))
        # One bundle verifies the SuperLink and the portal (another CA for the portal is appended).
        zf.writestr("ca.crt", ca + (b"\n" + portal_ca if portal_ca and portal_ca != ca else b""))
        zf.writestr("credential", token + "\n")
        zf.writestr(
            "README.md",
            _README.format(
                name=site.name, slug=site.slug, portal=settings.FRP_PORTAL_URL, address=address
            ),
        )
    with transaction.atomic():
        audit_record(by=by, action="site.kit_download", target=site, institution=site.institution)
    return buf.getvalue()


def site_node_key_submit(*, site: Site, public_key: str, by=None) -> SiteNode:
    """Register ``public_key`` (an OpenSSH ECDSA line) as ``site``'s SuperNode key.

    The same key again returns its record (idempotent); a new key replaces the site's previous one,
    which is unregistered after the new one is recorded. Raises ``OnboardingError`` for a revoked
    site, a key Flower does not accept, a key another site uses, or a SuperLink refusal.
    """
    if site.is_revoked:
        raise OnboardingError(f"site {site.slug} is revoked")
    try:
        key = nodekey.public_key_check(public_key)
        fp = nodekey.fingerprint(key)
    except nodekey.NodeKeyError as exc:
        raise OnboardingError(str(exc)) from exc
    current = SiteNode.objects.filter(site=site, status=SiteNodeStatus.REGISTERED).first()
    if current and current.public_key == key:
        return current
    if SiteNode.objects.filter(fingerprint=fp, status=SiteNodeStatus.REGISTERED).exists():
        raise OnboardingError("this key is registered for another site: make a new key pair")
    try:
        node_id = superlink.node_register(_connection(), key, name=site.slug)
    except superlink.SuperLinkError as exc:
        raise OnboardingError(f"the SuperLink did not register the key: {exc}") from exc
    with transaction.atomic():
        previous = list(
            SiteNode.objects.select_for_update().filter(site=site, status=SiteNodeStatus.REGISTERED)
        )
        for old in previous:
            old.status = SiteNodeStatus.UNREGISTERED
            old.unregistered_at = timezone.now()
            old.save(update_fields=["status", "unregistered_at"])
        node = SiteNode.objects.create(site=site, public_key=key, fingerprint=fp, node_id=node_id)
        audit_record(
            by=by,
            action="site.supernode_register",
            target=site,
            institution=site.institution,
            node_id=node_id,
            fingerprint=fp,
        )
        for old in previous:
            transaction.on_commit(partial(_unregister_quietly, old.node_id))
    return node


def _unregister_quietly(node_id: str) -> None:
    try:
        superlink.node_unregister(_connection(), node_id)
    except superlink.SuperLinkError as exc:
        log.warning("could not unregister replaced SuperNode %s: %s", node_id, exc)


def site_node_unregister(*, site: Site, by=None) -> list[str]:
    """Unregister every registered SuperNode key of ``site``; return their node ids.

    Raises ``OnboardingError`` when the SuperLink refuses (the record then stays registered, so
    a retry does it again).
    """
    done = []
    for node in SiteNode.objects.filter(site=site, status=SiteNodeStatus.REGISTERED):
        try:
            superlink.node_unregister(_connection(), node.node_id)
        except superlink.SuperLinkError as exc:
            raise OnboardingError(
                f"the SuperLink did not unregister {node.node_id}: {exc}"
            ) from exc
        with transaction.atomic():
            node.status = SiteNodeStatus.UNREGISTERED
            node.unregistered_at = timezone.now()
            node.save(update_fields=["status", "unregistered_at"])
            audit_record(
                by=by,
                action="site.supernode_unregister",
                target=site,
                institution=site.institution,
                node_id=node.node_id,
            )
        done.append(node.node_id)
    return done


def on_site_revoked(sender, *, site, by=None, **kwargs) -> None:
    """Receiver of ``portal.signals.site_revoked``: unregister the site's SuperNode after commit
    (a Celery task, retried while the SuperLink does not answer)."""
    # By name, so that this module does not import the tasks that import it.
    transaction.on_commit(
        partial(signature("federation.site_node_unregister", args=(site.pk,)).delay)
    )


@dataclass(frozen=True)
class NodeRow:
    """A site's SuperNode as the admin page shows it.

    ``state``: ``no key`` (nothing uploaded), ``registered`` (key known, never connected),
    ``online``, ``offline``, ``unregistered`` or ``unknown`` (the SuperLink did not answer);
    ``last_seen`` / ``registered_at``: the SuperLink's aware UTC datetimes, ``None`` when never.
    """

    site: Site
    node: SiteNode | None
    state: str
    last_seen: datetime | None
    registered_at: datetime | None


def site_nodes_state(*, sites) -> tuple[list[NodeRow], str]:
    """Each of ``sites`` with its SuperNode's state (one ``flwr supernode ls``), and the error
    text when the SuperLink did not answer (``""`` otherwise)."""
    sites = list(sites)
    nodes = {
        n.site_id: n
        for n in SiteNode.objects.filter(site__in=sites).order_by("site_id", "-created_at")
        if n.status == SiteNodeStatus.REGISTERED
    }
    latest = {}
    for n in SiteNode.objects.filter(site__in=sites).order_by("-created_at"):
        latest.setdefault(n.site_id, n)
    error = ""
    listed: dict[str, superlink.NodeState] = {}
    if nodes or latest:
        try:
            listed = {n.node_id: n for n in superlink.nodes_list(_connection())}
        except superlink.SuperLinkError as exc:
            error = str(exc)
    rows = []
    for site in sites:
        node = nodes.get(site.pk) or latest.get(site.pk)
        if node is None:
            rows.append(NodeRow(site, None, "no key", None, None))
            continue
        seen = listed.get(node.node_id)
        if node.status == SiteNodeStatus.UNREGISTERED:
            state = "unregistered"
        elif error:
            state = "unknown"
        else:
            state = seen.status if seen else "unregistered"
        rows.append(
            NodeRow(
                site,
                node,
                state,
                seen.last_seen if seen else None,
                seen.registered_at if seen else None,
            )
        )
    return rows, error


def site_node_record(*, site: Site, public_key: str, node_id: str) -> SiteNode:
    """Record a SuperNode key that was registered with the SuperLink elsewhere (the local
    runtime registers the keys of the sites beside the portal itself); idempotent."""
    key = nodekey.public_key_check(public_key)
    with transaction.atomic():
        current = SiteNode.objects.select_for_update().filter(
            site=site, status=SiteNodeStatus.REGISTERED
        )
        if any(n.node_id == str(node_id) for n in current):
            return next(n for n in current if n.node_id == str(node_id))
        current.update(status=SiteNodeStatus.UNREGISTERED, unregistered_at=timezone.now())
        SiteNode.objects.filter(node_id=str(node_id)).delete()  # a stale row of a reset SuperLink
        node = SiteNode.objects.create(
            site=site, public_key=key, fingerprint=nodekey.fingerprint(key), node_id=str(node_id)
        )
        audit_record(
            by=None,
            action="site.supernode_register",
            target=site,
            institution=site.institution,
            node_id=str(node_id),
            fingerprint=node.fingerprint,
        )
    return node

"""Every POST endpoint of the URLconf, walked with malformed bodies: none answers 500.

Issue 9, finding 7. The endpoints are enumerated from the root URLconf (the portal's own pages,
allauth's, the Django admin's), path parameters are filled with objects of the access-matrix world
(``tests/portal/matrix_world.py``), and each endpoint receives, from each actor: an empty form,
two forms whose every field (read from the page's own form, plus common names) holds junk —
5,000 characters, NUL bytes, numbers too large for any column, NaN, a list where one value is
expected —, a JSON list, a JSON body nested 100,000 levels deep, and a multipart body with a file of
random bytes. Each request runs in a savepoint that is rolled back, so no request sees another's
effects. A 500 (or an exception the test client re-raises) is collected with the endpoint, actor and
body, and all are reported at the end.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from portal.models import IdentityProvider, IdPProtocol, Membership, Role
from tests.portal.matrix_world import World, build_world

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

JUNK = [
    "x" * 5000,
    "\x00nul\x00",
    "99999999999999999999999999999",
    "NaN",
    "-1e309",
    "<script>alert(1)</script>",
    "../../etc/passwd",
    "",
]
COMMON_FIELDS = [
    "decision",
    "reason",
    "role",
    "roles",
    "email",
    "answer",
    "site",
    "note",
    "verifier_key",
    "institution",
    "expires_at",
    "login",
    "password",
    "title",
    "project",
    "datasets",
    "num_rounds",
    "learning_rate",
    "price_per_unit",
    "effective_from",
    "action",
    "_selected_action",
    "post",
]
_NAME_RE = re.compile(r'<(?:input|select|textarea)[^>]*\bname="([^"]+)"', re.I)


@dataclass(frozen=True)
class Endpoint:
    route: str
    name: str  # namespaced URL name ("" when unnamed)


def _walk(resolver, prefix: str = "", namespace: str = ""):
    for p in resolver.url_patterns:
        if isinstance(p, URLResolver):
            ns = f"{namespace}{p.namespace}:" if p.namespace else namespace
            yield from _walk(p, prefix + str(p.pattern), ns)
        elif isinstance(p, URLPattern):
            yield Endpoint(prefix + str(p.pattern), f"{namespace}{p.name}" if p.name else "")


def endpoints() -> list[Endpoint]:
    """Every route of the root URLconf, once."""
    seen, out = set(), []
    for e in _walk(get_resolver()):
        if e.route not in seen:
            seen.add(e.route)
            out.append(e)
    return out


def _admin_object(world: World, app_model: str):
    from django.apps import apps

    try:
        model = apps.get_model(app_model.replace("_", ".", 1))
    except (LookupError, ValueError):
        return None
    return model._default_manager.order_by("pk").first()


def url_of(e: Endpoint, world: World, idp: IdentityProvider) -> str | None:
    """A concrete URL for ``e``'s route, or ``None`` when it cannot be filled."""
    route = e.route.replace("^", "").replace("$", "")
    if route.startswith("admin/"):
        if "(?P<url>" in route:
            return "/admin/no-such-page/"
        if "(?P<app_label>" in route:
            return "/admin/portal/"
        match = re.match(r"admin/(\w+)/(\w+)/", route)
        if match and ("<path:object_id>" in route or "<object_id>" in route):
            obj = _admin_object(world, f"{match.group(1)}_{match.group(2)}")
            if obj is None:
                return None
            route = re.sub(r"<(?:path:)?object_id>", str(obj.pk), route)
    job = world.jobs["A-job"]
    values = {
        "slug": "project-a" if route.startswith("projects/") else world.institutions["A"].slug,
        "user_id": str(world.users["researcher@A"].pk),
        "token": world.invitation.token,
        "index": "0",
        "size": "1",
        "key": "abc-def",
        "uidb36": "1",
        "organization_slug": idp.provider_id,
        "provider_id": idp.provider_id,
    }
    if route.startswith("jobs/releases/"):
        values["pk"] = str(world.release.pk)
    elif route.startswith("jobs/") or route.startswith("accounting/credit/"):
        values["pk"] = str(job.pk)
    elif route.startswith("datasets/"):
        values["pk"] = str(world.dataset_versions[0].dataset_id)
    elif route.startswith("access-requests/"):
        values["pk"] = str(world.pending_request.pk)
    else:
        values["pk"] = "1"

    def fill(match):
        return values.get(match.group(1), "1")

    route = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: values.get(m.group(1), "1"), route)
    route = re.sub(r"<(?:\w+:)?(\w+)>", fill, route)
    route = route.replace("\\", "")
    return "/" + route


def _field_names(client: Client, url: str) -> list[str]:
    try:
        page = client.get(url)
    except Exception:  # noqa: BLE001 — a GET that raises is reported by its own test
        return []
    if page.status_code != 200 or "html" not in page.get("Content-Type", ""):
        return []
    return sorted(set(_NAME_RE.findall(page.content.decode(errors="replace"))))


def _junk(name: str, i: int) -> str:
    """Junk for field ``name``; a formset's form counts get junk Django bounds anyway (a count of
    10^29 builds its 1,000-form ceiling: slow, and no news)."""
    if name.endswith("_FORMS"):
        return ("NaN", "-1", "x" * 10)[i % 3]
    return JUNK[i % len(JUNK)]


def bodies(names: list[str]) -> list[tuple[str, dict]]:
    """``(label, client.post keyword arguments)`` of the malformed bodies for one endpoint."""
    fields = [n for n in dict.fromkeys([*names, *COMMON_FIELDS]) if n != "csrfmiddlewaretoken"]
    junk_a = {n: _junk(n, i) for i, n in enumerate(fields)}
    junk_b = {n: [_junk(n, i + 3), "2"] for i, n in enumerate(fields)}
    upload = {n: _junk(n, i + 5) for i, n in enumerate(fields)}
    upload["file"] = SimpleUploadedFile("junk.csv", os.urandom(4096), "text/csv")
    deep = "[" * 100_000 + "]" * 100_000
    return [
        ("empty form", {"data": {}}),
        ("junk form A", {"data": junk_a}),
        ("junk form B (lists)", {"data": junk_b}),
        ("multipart with random file", {"data": upload}),
        ("JSON list", {"data": "[1, 2, 3]", "content_type": "application/json"}),
        ("JSON 100,000 levels deep", {"data": deep, "content_type": "application/json"}),
    ]


ACTORS = ("anonymous", "researcher@A", "data-steward@A", "platform-admin")


@pytest.fixture
def world(settings, tmp_path) -> tuple[World, IdentityProvider]:
    settings.FRP_LEDGER_SIGNER_KEY = ""
    settings.FRP_LEDGER_KEY_FILE = tmp_path / "ledger" / "signer.key"
    w = build_world()
    admin = w.users["platform-admin"]
    admin.is_superuser = True
    admin.save()
    Membership.objects.create(
        user=w.users["data-steward@A"],
        institution=w.institutions["A"],
        role=Role.INSTITUTION_ADMIN,
    )
    # An IdP whose issuer does not answer: a sign-in POST must not become a 500 (finding 3).
    from portal.services import identity_provider_configure

    settings.FRP_OIDC_ALLOWED_HOSTS = ["127.0.0.1"]
    idp = identity_provider_configure(
        by=w.users["data-steward@A"],
        institution=w.institutions["A"],
        protocol=IdPProtocol.OIDC,
        issuer="http://127.0.0.1:9/",
        client_id="walker",
        client_secret="walker-secret",
    )
    return w, idp


@pytest.mark.parametrize("actor", ACTORS)
def test_no_post_endpoint_answers_500_to_malformed_bodies(world, actor):
    w, idp = world
    client = Client(raise_request_exception=False)
    if actor != "anonymous":
        client.force_login(w.users[actor])
    failures, posted = [], 0
    for endpoint in endpoints():
        if endpoint.route.startswith("admin/") and actor != "platform-admin":
            continue  # the admin answers everyone else with its sign-in page
        url = url_of(endpoint, w, idp)
        if url is None:
            continue
        names = _field_names(client, url)
        for label, kwargs in bodies(names):
            with transaction.atomic():
                try:
                    response = client.post(url, **kwargs)
                    status = response.status_code
                except Exception as exc:  # noqa: BLE001 — collected and reported below
                    status = f"{type(exc).__name__}: {exc}"[:300]
                transaction.set_rollback(True)
            posted += 1
            if status == 500 or not isinstance(status, int):
                failures.append(f"{url} [{endpoint.name}] {label}: {status}")
            client.cookies.pop("messages", None)
        if actor != "anonymous":
            client.force_login(w.users[actor])  # a POST may have signed the actor out
    assert posted > 300  # the walk is real: every endpoint, every body
    assert not failures, f"{len(failures)} of {posted} POSTs answered 500:\n" + "\n".join(failures)


def test_the_walk_reaches_every_portal_post_endpoint(world):
    """The enumeration is complete: the portal's own POST-only views are all in it."""
    w, idp = world
    routes = {e.route for e in endpoints()}
    for route in (
        "jobs/callback/<int:pk>/",
        "access-requests/<int:pk>/decide/",
        "jobs/releases/<int:pk>/decide/",
        "ledger/witnesses",
        "sso/discover/",
        "accounts/oidc/^(?P<provider_id>[^/]+)/login/",
    ):
        assert route in routes, route
    assert len(routes) > 150
    urls = {url_of(e, w, idp) for e in endpoints()}
    assert f"/accounts/oidc/{idp.provider_id}/login/" in urls  # regex routes are filled too
    assert f"/jobs/{w.jobs['A-job'].pk}/stop/" in urls


# --- signed callbacks with extreme numbers ------------------------------------------------------

#: Numbers at and past the edges of the columns and of the contract: 32-bit and 53-bit integers,
#: the largest count the contract allows (2⁶³−1) and one past it, the largest seconds it allows.
EXTREME_INTS = [2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63]
EXTREME_FLOATS = [1e9, 1e9 + 1, 1e12, 1e308]


def _callback_templates(slugs: list[str]) -> list[dict]:
    """One well-formed event of each kind the ServerApp sends, naming ``slugs``."""
    site_round = {
        "ok": True,
        "train_examples": 40,
        "eval_examples": 10,
        "train_loss": 0.5,
        "eval_loss": 0.5,
        "eval_accuracy": 0.9,
        "cpu_seconds": 1.0,
        "wall_seconds": 1.0,
        "bytes_received": 100,
        "bytes_sent": 100,
    }
    metering = {
        "examples": 10,
        "cpu_seconds": 1.0,
        "wall_seconds": 1.0,
        "bytes_received": 1,
        "bytes_sent": 1,
    }
    return [
        {"event": "started", "nodes": {s: str(i + 1) for i, s in enumerate(slugs)}},
        {
            "event": "round",
            "round": 1,
            "train_loss": 0.5,
            "eval_loss": 0.5,
            "eval_accuracy": 0.9,
            "train_examples": 80,
            "eval_examples": 20,
            "wall_seconds": 2.0,
            "sites": {s: dict(site_round) for s in slugs},
        },
        {
            "event": "finished",
            "rounds": 1,
            "eval_accuracy": 0.9,
            "eval_loss": 0.5,
            "eval_examples": 20,
            "model": [[0.5, 0.25]],
            "sites": {s: {"eval_examples": 10, "eval_accuracy": 0.9} for s in slugs},
        },
        {
            "event": "contribution",
            "players": slugs,
            "method": "exact",
            "utilities": {"0": {"": 0.5, "0": 0.7, "1": 0.6, "0,1": 0.9}},
            "examples": {s: 10 for s in slugs},
            "models": 4,
            "permutations": 0,
            "seed": 0,
            "sites": {s: dict(metering) for s in slugs},
            "wall_seconds": 1.0,
        },
    ]


def _numeric_variants(payload: dict):
    """``(path, payload with that one number replaced)`` for every numeric leaf and extreme."""

    def leaves(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from leaves(v, (*path, k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from leaves(v, (*path, i))
        elif isinstance(node, int | float) and not isinstance(node, bool):
            yield path, node

    def replaced(node, path, value):
        if not path:
            return value
        copy = dict(node) if isinstance(node, dict) else list(node)
        copy[path[0]] = replaced(node[path[0]], path[1:], value)
        return copy

    for path, old in leaves(payload, ()):
        for value in EXTREME_INTS if isinstance(old, int) else EXTREME_FLOATS + EXTREME_INTS:
            yield ".".join(map(str, path)) + f"={value}", replaced(payload, path, value)


def test_signed_callbacks_with_extreme_numbers_never_answer_500(world):
    """Hostile re-test, finding 7: a signed ``round`` with ``train_examples = 2**31`` (the
    contract allowed 2⁶³−1, the columns were 32-bit) was a 500 ``DataError`` on PostgreSQL.

    Every numeric field of every event the ServerApp sends, at every extreme, signed with the
    run's real key, each as the first event of a running job (in a savepoint rolled back after).
    """
    from federation.models import JobStatus
    from tests.federation.callback_support import body_of, post, signed

    w, _ = world
    job = w.jobs["A-job"]
    job.status, job.flower_run_id = JobStatus.RUNNING, "7"
    job.save(update_fields=["status", "flower_run_id"])
    slugs = sorted(job.sites.values_list("site__slug", flat=True))
    client = Client(raise_request_exception=False)
    failures, posted, statuses = [], 0, set()
    for template in _callback_templates(slugs):
        for label, payload in _numeric_variants(template):
            body = body_of(payload, seq=1)
            with transaction.atomic():
                try:
                    status = post(client, job, body, signed(job, body)).status_code
                except Exception as exc:  # noqa: BLE001 — collected and reported below
                    status = f"{type(exc).__name__}: {exc}"[:300]
                transaction.set_rollback(True)
            posted += 1
            statuses.add(status)
            if status == 500 or not isinstance(status, int):
                failures.append(f"{template['event']} {label}: {status}")
    assert posted > 200 and 200 in statuses and 400 in statuses  # accepted and refused ones
    assert not failures, (
        f"{len(failures)} of {posted} signed callbacks answered 500:\n" + "\n".join(failures)
    )

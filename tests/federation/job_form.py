"""The job form as a browser posts it, and the sites' own rows, for the integration tests.

Shared by the modules that submit jobs through ``/jobs/new/`` on a real Flower deployment and check
the outcome against scikit-learn on the pooled rows (quality, models, trees, strategies, privacy,
SecAgg+, scheduling).
"""

from __future__ import annotations

from collections.abc import Iterator
from html.parser import HTMLParser

from django.test import Client
from django.urls import reverse

from frp_flwr import contract
from frp_flwr.preprocess import site_frame
from sandbox.keyring import SiteKeyring
from sandbox.loader import load_table
from sandbox.storage import FilesystemStore


class _FormFields(HTMLParser):
    """The values a browser would post for the first ``<form method="post">`` of a page."""

    def __init__(self):
        super().__init__()
        self.fields: list[tuple[str, str]] = []
        self._select: str | None = None
        self._in_form = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "form" and a.get("method") == "post":
            self._in_form = True
        if not self._in_form:
            return
        if tag == "input" and a.get("name"):
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio"):
                if "checked" in a:
                    self.fields.append((a["name"], a.get("value", "on")))
            elif kind not in ("submit", "button"):
                self.fields.append((a["name"], a.get("value") or ""))
        elif tag == "select":
            self._select = a.get("name")
        elif tag == "option" and self._select and "selected" in a:
            self.fields.append((self._select, a.get("value", "")))

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        if tag == "form":
            self._in_form = False


def post_data(page: str, **overrides) -> dict:
    """The first POST form of ``page`` as a browser would submit it, with ``overrides`` set.

    Returns ``{field name: [values]}`` (Django's test client posts a list as repeated fields); an
    override that is not a list becomes a one-element list of its ``str``.
    """
    parser = _FormFields()
    parser.feed(page)
    data: dict[str, list[str]] = {}
    for name, value in parser.fields:
        data.setdefault(name, []).append(value)
    data.update({k: v if isinstance(v, list) else [str(v)] for k, v in overrides.items()})
    return data


def job_form_data(
    client: Client, *, datasets: list[str], target: str, title: str, **fields
) -> tuple[str, dict]:
    """What a researcher posts to create a job: open the form, tick ``datasets`` (version pks) and
    the ``target`` column (the form redraws with the columns table), then set ``fields``.

    Returns ``(form page after the redraw, data to post)``. Raises ``AssertionError`` when either
    page does not answer 200.
    """
    url = reverse("federation:job_create")
    first = client.get(url)
    assert first.status_code == 200
    refreshed = client.post(
        url,
        post_data(
            first.content.decode(),
            datasets=datasets,
            target_column=target,
            title=title,
            refresh="1",
        ),
    )
    assert refreshed.status_code == 200
    form_page = refreshed.content.decode()
    data = post_data(form_page, **fields)
    data.pop("refresh", None)
    return form_page, data


def decrypted_table(world, site: str, dataset_version):
    """The site's table of ``dataset_version``, read from its own store with its own key."""
    return load_table(
        store=FilesystemStore(world.sites_dir / site / "store"),
        kek=SiteKeyring(world.sites_dir / site / "keyring").get(site),
        store_key=dataset_version.store_key,
        site=site,
        dataset=dataset_version.dataset.slug,
        version=dataset_version.version,
    ).data


def site_frames(world, job, spec: contract.JobSpec) -> Iterator[tuple[str, object]]:
    """``(site slug, frame)`` for each of the job's sites: the app's own split of the site's rows
    (``site_frame`` with the app's held-out fraction 0.2 and seed 42) under ``spec``."""
    for js in job.sites.select_related("site", "dataset_version__dataset"):
        site = js.site.slug
        table = decrypted_table(world, site, js.dataset_version)
        yield site, site_frame(table, spec, test_fraction=0.2, seed=42)

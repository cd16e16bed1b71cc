"""Data registered at the site: the sites' API (sandbox.site_api) with a real site-side ingest.

The CSV is encrypted by ``sandbox.ingest.ingest_csv`` into a store the portal does not see, with a
key the portal never holds; the API receives only what ``IngestResult`` holds, authenticated by the
site's credential.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from django.test import Client
from django.urls import reverse

from portal.sites import site_credential_issue
from sandbox.crypto import generate_key
from sandbox.ingest import ingest_csv
from sandbox.models import DatasetVersion
from sandbox.storage import FilesystemStore
from tests.factories import SiteFactory, UserFactory

pytestmark = pytest.mark.django_db

CSV = "age,diagnosis\n" + "".join(f"{30 + i % 40},{i % 2}\n" for i in range(60))


def _ingest(tmp_path, site, version=1, dataset="bc"):
    src = tmp_path / "data.csv"
    src.write_text(CSV)
    store = FilesystemStore(tmp_path / "store")
    return ingest_csv(
        src, site=site.slug, dataset=dataset, version=version, store=store, kek=generate_key()
    )


def _body(result, *, dataset="bc", version=1, title="BC"):
    return {
        "dataset": dataset,
        "title": title,
        "version": version,
        "result": {**dataclasses.asdict(result), "missing_values": list(result.missing_values)},
    }


def _post(client, token, url, body):
    return client.post(
        url,
        json.dumps(body) if not isinstance(body, bytes) else body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_site_registers_its_ingest_and_nothing_else(tmp_path):
    site = SiteFactory()
    token = site_credential_issue(by=None, site=site)
    client = Client()
    nxt = client.get(
        reverse("sandbox:api_next_version", args=["bc"]), HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert nxt.json() == {"version": 1}
    result = _ingest(tmp_path, site)
    response = _post(client, token, reverse("sandbox:api_datasets"), _body(result))
    assert response.status_code == 201, response.content
    dv = DatasetVersion.objects.get(pk=response.json()["id"])
    assert (dv.dataset.site, dv.version, dv.row_count) == (site, 1, 60)
    assert dv.ciphertext_sha256 == result.ciphertext_sha256 and dv.profile == result.profile
    listed = client.get(reverse("sandbox:api_datasets"), HTTP_AUTHORIZATION=f"Bearer {token}")
    assert listed.json()["versions"][0]["store_key"] == result.store_key
    # The same version again: taken.
    again = _post(client, token, reverse("sandbox:api_datasets"), _body(result))
    assert again.status_code == 409
    assert DatasetVersion.objects.count() == 1


def test_rewrapped_object_reported(tmp_path):
    site = SiteFactory()
    token = site_credential_issue(by=None, site=site)
    client = Client()
    dv_id = _post(client, token, reverse("sandbox:api_datasets"), _body(_ingest(tmp_path, site)))
    dv_id = dv_id.json()["id"]
    url = reverse("sandbox:api_version_object", args=[dv_id])
    ok = _post(client, token, url, {"size_bytes": 123, "ciphertext_sha256": "a" * 64})
    assert ok.status_code == 200
    assert DatasetVersion.objects.get(pk=dv_id).ciphertext_sha256 == "a" * 64
    other = site_credential_issue(by=None, site=SiteFactory())
    assert (
        _post(client, other, url, {"size_bytes": 1, "ciphertext_sha256": "b" * 64}).status_code
        == 404
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.update(version=0), "version must be"),
        (lambda b: b.update(title=""), "needs a title"),
        (lambda b: b["result"].update(store_key="other/bc/v1.enc"), "store_key must be"),
        (lambda b: b["result"].update(ciphertext_sha256="xyz"), "64 lower-case hex"),
        (lambda b: b["result"].update(schema=[{"name": "a", "type": "blob"}]), "schema"),
        (lambda b: b["result"].update(row_count=-1), "row_count"),
        (lambda b: b["result"].update(profile=[]), "profile"),
        (lambda b: b.update(dataset="../x"), "dataset id"),
        (lambda b: b.update(result="rows"), "result must be"),
    ],
)
def test_bad_registration_is_a_400_and_writes_nothing(tmp_path, change, message):
    site = SiteFactory()
    token = site_credential_issue(by=None, site=site)
    body = _body(_ingest(tmp_path, site))
    change(body)
    response = _post(Client(), token, reverse("sandbox:api_datasets"), body)
    assert response.status_code == 400 and message in response.json()["error"]
    assert not DatasetVersion.objects.exists()


def test_no_or_foreign_credential_refused(tmp_path):
    site = SiteFactory()
    client = Client()
    url = reverse("sandbox:api_datasets")
    assert client.get(url).status_code == 401
    assert client.get(url, HTTP_AUTHORIZATION="Bearer frps_forged").status_code == 401
    assert _post(client, "x", url, b"not json").status_code == 401
    token = site_credential_issue(by=None, site=site)
    assert _post(client, token, url, b"not json").status_code == 400


@pytest.mark.parametrize(
    ("change", "message"),
    [  # issue 9, findings 6 and 7 on the site's ingest path (hostile re-test)
        (lambda b: b["result"].update(row_count=10**30), "row_count must be"),
        (lambda b: b["result"].update(size_bytes=2**63), "size_bytes must be"),
        (lambda b: b["result"].update(source_bytes=10**30), "source_bytes must be"),
        (
            lambda b: b["result"].update(
                schema=[{"name": f"c{i}", "type": "int"} for i in range(1001)]
            ),
            "FRP_MAX_COLUMNS",
        ),
        (lambda b: b["result"]["schema"].append({"name": "age", "type": "int"}), "distinct"),
        (lambda b: b["result"].update(profile={"rows": "x", "columns": None}), "profile"),
        (lambda b: b["result"]["profile"].update(columns=[1, 2]), "must be an object"),
        (lambda b: b["result"]["profile"]["columns"].pop(), "one entry per schema column"),
        (lambda b: b["result"]["profile"]["columns"][0].update(mean="x"), "mean must be"),
        (lambda b: b["result"]["profile"]["columns"][0].update(missing=-1), "missing must be"),
        (lambda b: b["result"]["profile"]["columns"][0].update(top=5), "unknown keys"),
        (lambda b: b["result"]["profile"]["columns"][1].update(name="other"), "name and type"),
    ],
)
def test_a_site_cannot_register_figures_the_portal_cannot_hold_or_show(tmp_path, change, message):
    """Counts beyond 64 bits were a 500 (bigint out of range); a schema over FRP_MAX_COLUMNS was
    accepted; a malformed profile was stored and made the dataset page a 500 for every visitor."""
    site = SiteFactory()
    token = site_credential_issue(by=None, site=site)
    body = _body(_ingest(tmp_path, site))
    change(body)
    response = _post(Client(), token, reverse("sandbox:api_datasets"), body)
    assert response.status_code == 400, response.content
    assert message in response.json()["error"]
    assert not DatasetVersion.objects.exists()


def test_a_registered_profile_renders_for_a_researcher(tmp_path):
    site = SiteFactory()
    token = site_credential_issue(by=None, site=site)
    response = _post(
        Client(), token, reverse("sandbox:api_datasets"), _body(_ingest(tmp_path, site))
    )
    assert response.status_code == 201, response.content
    viewer = Client()
    viewer.force_login(UserFactory())
    dv = DatasetVersion.objects.get()
    assert viewer.get(f"/datasets/{dv.dataset_id}/").status_code == 200

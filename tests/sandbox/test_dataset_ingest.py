"""Registering datasets: the site-side command ``dataset_ingest`` and the steward's web upload.

Real parts: PostgreSQL, a real ``FilesystemStore`` and keyring in a temp site directory, the real
ingest and loader; what is asserted is read back from the store with the site's key.
"""

from __future__ import annotations

import hashlib
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from portal.models import AuditEvent, Membership, Role
from sandbox import services
from sandbox.loader import load_table
from sandbox.models import Dataset, DatasetVersion
from sandbox.sitestore import local_site_storage
from tests.factories import SiteFactory, UserFactory

pytestmark = pytest.mark.django_db

# Semicolon-delimited, Windows-1252 (é = 0xE9), CRLF, NA as a country code in one row (Namibia) and
# as a missing score in another.
GOOD_CP1252 = (
    "id;country;score;note\r\n1;NA;3.5;caf\xe9\r\n2;FR;NA;plain\r\n3;DE;4.25;\r\n"
).encode("cp1252")
# The same with a quoted field holding the delimiter and a newline (tests below declare the
# delimiter; detection of this case is tested in test_csvformat.py).
QUOTED_CP1252 = GOOD_CP1252.replace(b"caf\xe9", b'"caf\xe9; open\nlate"')


@pytest.fixture
def site(settings, tmp_path):
    settings.FRP_SITES_DIR = tmp_path / "sites"
    site = SiteFactory(slug="hospital-x")
    (settings.FRP_SITES_DIR / site.slug).mkdir(parents=True)
    return site


@pytest.fixture
def steward(site):
    user = UserFactory()
    Membership.objects.create(user=user, institution=site.institution, role=Role.DATA_STEWARD)
    return user


def _objects(site) -> list[str]:
    root = local_site_storage(site).store_url.removeprefix("file://")
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())


def _load(dv):
    local = local_site_storage(dv.dataset.site)
    return load_table(
        store=local.store(),
        kek=local.keyring().get(dv.dataset.site.slug),
        store_key=dv.store_key,
        site=dv.dataset.site.slug,
        dataset=dv.dataset.slug,
        version=dv.version,
    )


# --- the command ------------------------------------------------------------------------------


def test_command_ingests_registers_and_records_read_parameters(site, tmp_path):
    path = tmp_path / "survey.csv"
    path.write_bytes(GOOD_CP1252)
    out = StringIO()
    call_command(
        "dataset_ingest",
        str(path),
        "--site",
        site.slug,
        "--dataset",
        "survey",
        "--title",
        "Survey",
        "--missing",
        "",
        "--type",
        "country=str",
        "--type",
        "id=int",
        stdout=out,
    )
    dv = DatasetVersion.objects.get()
    assert (dv.version, dv.dataset.slug, dv.dataset.title, dv.row_count) == (
        1,
        "survey",
        "Survey",
        3,
    )
    assert (dv.encoding, dv.encoding_source) == ("cp1252", "detected")
    assert (dv.delimiter, dv.delimiter_source) == (";", "detected")
    assert dv.missing_values == [""]
    assert dv.source_bytes == len(GOOD_CP1252)
    assert dv.source_sha256 == hashlib.sha256(GOOD_CP1252).hexdigest()
    assert "version 1" in out.getvalue() and "semicolon" in out.getvalue()
    # Only "" is missing: NA in country is a value (Namibia), NA in score makes it a str column.
    table = _load(dv)
    assert table.data["country"].tolist() == ["NA", "FR", "DE"]
    assert table.data["note"].tolist()[0] == "café"
    assert {c["name"]: c["type"] for c in dv.schema}["score"] == "str"
    # The object in the store is what the row says.
    assert _objects(site) == ["hospital-x/survey/v1.csv.enc"]
    stored = Path(local_site_storage(site).store_url.removeprefix("file://")) / dv.store_key
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == dv.ciphertext_sha256
    assert AuditEvent.objects.filter(action="dataset.register", target_id=str(dv.pk)).exists()


def test_command_second_ingest_is_a_new_version_with_declared_markers(site, tmp_path):
    path = tmp_path / "survey.csv"
    path.write_bytes(GOOD_CP1252)
    args = ["--site", site.slug, "--dataset", "survey", "--title", "Survey"]
    call_command("dataset_ingest", str(path), *args, stdout=StringIO())
    quoted = tmp_path / "quoted.csv"
    quoted.write_bytes(QUOTED_CP1252)
    call_command(
        "dataset_ingest",
        str(quoted),
        *args,
        "--missing",
        "",
        "--missing",
        "NA",
        "--encoding",
        "cp1252",
        "--delimiter",
        "semicolon",
        stdout=StringIO(),
    )
    v1, v2 = DatasetVersion.objects.order_by("version")
    assert (v1.version, v2.version) == (1, 2)
    assert (v2.encoding_source, v2.delimiter_source) == ("declared", "declared")
    assert v2.missing_values == ["", "NA"]
    assert {c["name"]: c["type"] for c in v2.schema}["score"] == "float"
    assert _load(v2).data["country"].tolist() == [None, "FR", "DE"]
    assert _load(v2).data["note"].tolist()[0] == "café; open\nlate"
    assert _load(v1).data["country"].tolist()[0] == "NA"  # version 1 is unchanged
    assert _objects(site) == ["hospital-x/survey/v1.csv.enc", "hospital-x/survey/v2.csv.enc"]


def test_command_bad_file_names_line_and_column_and_leaves_nothing(site, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("id,age\n1,40\n2,41\n3,forty-two\n", encoding="utf-8")
    with pytest.raises(CommandError) as err:
        call_command(
            "dataset_ingest",
            str(path),
            "--site",
            site.slug,
            "--dataset",
            "bad",
            "--title",
            "Bad",
            "--type",
            "age=int",
        )
    assert "line 4" in str(err.value) and "'age'" in str(err.value)
    assert not DatasetVersion.objects.exists() and not Dataset.objects.exists()
    assert _objects(site) == []


def test_command_ragged_row_names_line_and_bad_arguments_exit_non_zero(site, tmp_path):
    import subprocess
    import sys

    path = tmp_path / "ragged.csv"
    path.write_text("a,b,c\n1,2,3\n4,5\n", encoding="utf-8")
    with pytest.raises(CommandError, match=r"line 3: expected 3 fields, found 2"):
        call_command(
            "dataset_ingest", str(path), "--site", site.slug, "--dataset", "r", "--title", "R"
        )
    # As a process (which cannot see this test's database), a missing argument exits non-zero.
    proc = subprocess.run(
        [sys.executable, "manage.py", "dataset_ingest", str(path), "--site", site.slug],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        check=False,
    )
    assert proc.returncode != 0 and "--dataset" in proc.stderr


def test_command_bad_type_override_and_unknown_site(site, tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text("a\n1\n", encoding="utf-8")
    with pytest.raises(CommandError, match="must be one of int, float, bool, date, str"):
        call_command(
            "dataset_ingest", str(path), "--site", site.slug, "--dataset", "d", "--type", "a=num"
        )
    with pytest.raises(CommandError, match="no site 'nowhere'"):
        call_command("dataset_ingest", str(path), "--site", "nowhere", "--dataset", "d")
    with pytest.raises(CommandError, match="needs a title"):
        call_command("dataset_ingest", str(path), "--site", site.slug, "--dataset", "d")


def test_command_with_explicit_store_and_keyring_for_a_remote_site(settings, tmp_path):
    settings.FRP_SITES_DIR = tmp_path / "none-here"
    site = SiteFactory(slug="remote-site")
    path = tmp_path / "ok.csv"
    path.write_text("a,b\n1,x\n2,y\n", encoding="utf-8")
    with pytest.raises(CommandError, match="no store on this machine"):
        call_command(
            "dataset_ingest", str(path), "--site", site.slug, "--dataset", "d", "--title", "D"
        )
    store_dir = tmp_path / "remote-store"
    call_command(
        "dataset_ingest",
        str(path),
        "--site",
        site.slug,
        "--dataset",
        "d",
        "--title",
        "D",
        "--store",
        store_dir.as_uri(),
        "--keyring",
        str(tmp_path / "remote-keys"),
        stdout=StringIO(),
    )
    assert (store_dir / "remote-site/d/v1.csv.enc").is_file()
    assert (tmp_path / "remote-keys/remote-site.kek").stat().st_mode & 0o777 == 0o600


def test_lost_race_is_a_clear_error_and_leaves_no_object(site, tmp_path, monkeypatch):
    """Another ingest registers the same version between our ingest and our insert."""
    path = tmp_path / "ok.csv"
    path.write_text("a,b\n1,x\n2,y\n", encoding="utf-8")
    real_ingest = services.ingest_csv

    def ingest_then_lose(*args, **kwargs):
        result = real_ingest(*args, **kwargs)
        dataset = Dataset.objects.create(site=site, slug=kwargs["dataset"], title="Winner")
        DatasetVersion.objects.create(
            dataset=dataset,
            version=kwargs["version"],
            schema=[],
            row_count=0,
            size_bytes=0,
            ciphertext_sha256="f" * 64,
            store_key="elsewhere/v.enc",
        )
        return result

    monkeypatch.setattr(services, "ingest_csv", ingest_then_lose)
    with pytest.raises(CommandError, match="version 1 of hospital-x/d was registered by another"):
        call_command(
            "dataset_ingest", str(path), "--site", site.slug, "--dataset", "d", "--title", "D"
        )
    assert _objects(site) == []
    assert list(DatasetVersion.objects.values_list("dataset__title", "version")) == [("Winner", 1)]


def test_concurrent_ingest_of_the_same_dataset_is_refused(site, steward, tmp_path):
    """A second connection holds the dataset's advisory lock (as a running ingest does)."""
    import psycopg
    from django.db import connection

    path = tmp_path / "ok.csv"
    path.write_text("a\n1\n", encoding="utf-8")
    db = connection.settings_dict
    other = psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    )
    try:
        other.execute("SELECT pg_advisory_lock(%s)", [services._dataset_lock_key(site, "d")])
        with pytest.raises(services.DatasetError, match="another ingest of hospital-x/d"):
            services.dataset_ingest(by=steward, site=site, path=path, slug="d", title="D")
        other.execute("SELECT pg_advisory_lock(%s, %s)", [services._LOCK_CLASS, site.pk])
        with pytest.raises(services.DatasetError, match="key rotation of site hospital-x"):
            services.dataset_ingest(by=steward, site=site, path=path, slug="e", title="E")
    finally:
        # Released before closing: a closed connection's backend drops its session locks only
        # when the server has processed the disconnect, which under load came after the ingest
        # below had already asked for them (a CI failure: "another ingest ... is running").
        other.execute("SELECT pg_advisory_unlock_all()")
        other.close()
    assert _objects(site) == [] and not DatasetVersion.objects.exists()
    dv = services.dataset_ingest(by=steward, site=site, path=path, slug="d", title="D")
    assert dv.version == 1  # and our own locks were released


def test_service_refuses_a_non_steward(site, tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text("a\n1\n", encoding="utf-8")
    with pytest.raises(services.DatasetError, match="only a data steward"):
        services.dataset_ingest(by=UserFactory(), site=site, path=path, slug="d", title="D")


def test_missing_key_after_the_first_version_is_a_clear_error(site, steward, tmp_path):
    path = tmp_path / "ok.csv"
    path.write_text("a\n1\n", encoding="utf-8")
    services.dataset_ingest(by=steward, site=site, path=path, slug="d", title="D")
    local_site_storage(site).keyring().key_path(site.slug).unlink()
    with pytest.raises(services.KeyringError, match="no key-encryption key for site"):
        services.dataset_ingest(by=steward, site=site, path=path, slug="d", title="D")
    assert _objects(site) == ["hospital-x/d/v1.csv.enc"]


# --- the web upload ---------------------------------------------------------------------------


def _post(client, follow: bool = False, **data):
    return client.post(reverse("sandbox:dataset_upload"), data, follow=follow)


def _csv(name: str, content: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, content, content_type="text/csv")


def test_steward_uploads_and_sees_version_read_parameters_and_profile(client, site, steward):
    client.force_login(steward)
    page = client.get(reverse("sandbox:dataset_upload"))
    assert page.status_code == 200 and b"hospital-x" in page.content
    rows = "".join(f"{i};{'A' if i % 2 else 'B'};{i * 1.5}\r\n" for i in range(40))
    content = ("id;group;value\r\n" + rows).encode("utf-16")
    response = _post(
        client,
        site=site.pk,
        slug="trial",
        title="Trial",
        description="A test cohort",
        file=_csv("trial.csv", content),
        encoding="",
        delimiter="",
        empty_is_missing="on",
        missing_markers="NA\n-999",
        types="id=int",
    )
    dv = DatasetVersion.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("sandbox:dataset_detail", args=[dv.dataset_id])
    assert (dv.encoding, dv.encoding_source, dv.delimiter) == ("utf-16", "bom", ";")
    assert dv.missing_values == ["", "NA", "-999"]
    assert dv.created_by == steward and dv.row_count == 40
    page = client.get(response["Location"]).content.decode()
    assert "Version 1" in page and "utf-16" in page and "semicolon" in page and "bom" in page
    assert "A: 20" in page and "B: 20" in page  # the profile's category counts
    assert "-999" in page


def test_upload_new_version_of_existing_dataset(client, site, steward):
    client.force_login(steward)
    _post(
        client,
        site=site.pk,
        slug="d",
        title="D",
        file=_csv("a.csv", b"a,b\n1,2\n"),
        empty_is_missing="on",
    )
    dataset = Dataset.objects.get()
    page = client.get(reverse("sandbox:dataset_upload") + f"?dataset={dataset.pk}")
    assert f'value="{dataset.pk}" selected' in page.content.decode()
    response = _post(
        client, site=site.pk, dataset=dataset.pk, file=_csv("b.csv", b"a\tb\n3\t4\n5\t6\n")
    )
    assert response.status_code == 302
    assert list(
        dataset.versions.order_by("version").values_list("version", "row_count", "delimiter")
    ) == [
        (1, 1, ","),
        (2, 2, "\t"),
    ]
    assert dataset.versions.get(version=2).missing_values == []  # empty cells not missing here
    page = client.get(reverse("sandbox:dataset_detail", args=[dataset.pk])).content.decode()
    assert "Version 2" in page and "none declared" in page and "<th>Delimiter</th>" in page
    # A new dataset may not reuse a slug: that would silently add a version to another dataset.
    response = _post(client, site=site.pk, slug="d", title="Other", file=_csv("c.csv", b"a\n1\n"))
    assert (
        response.status_code == 200
        and "already has a dataset with this slug" in response.content.decode()
    )


def test_bad_file_shows_inline_error_and_leaves_nothing(client, site, steward):
    client.force_login(steward)
    response = _post(
        client,
        site=site.pk,
        slug="bad",
        title="Bad",
        file=_csv("bad.csv", b"id,when\n1,2024-01-02\n2,2024-13-45x\n"),
        types="when=date",
        empty_is_missing="on",
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="file-error"' in html
    assert "bad.csv: line 3, column &#x27;when&#x27;" in html
    assert not Dataset.objects.exists() and not DatasetVersion.objects.exists()
    assert _objects(site) == []
    # an invalid override is a field error before any ingest
    response = _post(
        client, site=site.pk, slug="bad", title="Bad", file=_csv("x.csv", b"a\n1\n"), types="a"
    )
    assert "write a type override as column=type" in response.content.decode()
    assert _objects(site) == []


def test_non_steward_gets_403_and_steward_without_local_site_cannot_upload(client, site, settings):
    researcher = UserFactory()
    Membership.objects.create(user=researcher, institution=site.institution, role=Role.RESEARCHER)
    client.force_login(researcher)
    assert client.get(reverse("sandbox:dataset_upload")).status_code == 403
    response = _post(client, site=site.pk, slug="d", title="D", file=_csv("a.csv", b"a\n1\n"))
    assert response.status_code == 403
    assert _objects(site) == [] and not Dataset.objects.exists()
    # a steward of another institution: the site is not a choice
    other = UserFactory()
    Membership.objects.create(
        user=other, institution=SiteFactory().institution, role=Role.DATA_STEWARD
    )
    client.force_login(other)
    page = client.get(reverse("sandbox:dataset_upload"))
    assert page.status_code == 200 and b"None of your institution" in page.content
    response = _post(client, site=site.pk, slug="d", title="D", file=_csv("a.csv", b"a\n1\n"))
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()
    assert _objects(site) == [] and not Dataset.objects.exists()


def test_upload_is_streamed_to_a_temporary_file(client, site, steward, monkeypatch):
    """The view installs only the temporary-file upload handler: the file is never in memory."""
    seen = {}
    real = services.dataset_ingest

    def spy(**kwargs):
        seen["path"] = Path(kwargs["path"])
        seen["exists"] = seen["path"].is_file()
        return real(**kwargs)

    monkeypatch.setattr(services, "dataset_ingest", spy)
    client.force_login(steward)
    _post(client, site=site.pk, slug="d", title="D", file=_csv("small.csv", b"a\n1\n"))
    assert seen["exists"] and seen["path"].name.endswith(".upload.csv")
    assert not seen["path"].exists()  # deleted with the request


def test_object_left_by_a_crashed_ingest_is_replaced(site, steward, tmp_path):
    """A crash between the store write and the row insert left v1's object with no row."""
    path = tmp_path / "ok.csv"
    path.write_text("a\n1\n", encoding="utf-8")
    store = local_site_storage(site).store()
    stale = tmp_path / "stale.enc"
    stale.write_bytes(b"not even ciphertext")
    store.put_file("hospital-x/d/v1.csv.enc", stale)
    dv = services.dataset_ingest(by=steward, site=site, path=path, slug="d", title="D")
    assert dv.version == 1 and _load(dv).n_rows == 1
    assert hashlib.sha256(store.get_bytes(dv.store_key)).hexdigest() == dv.ciphertext_sha256


def test_upload_still_checks_csrf(site, steward):
    """The view picks its upload handler before the CSRF check, which must still run."""
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(steward)
    response = _post(client, site=site.pk, slug="d", title="D", file=_csv("a.csv", b"a\n1\n"))
    assert response.status_code == 403 and b"CSRF" in response.content
    assert _objects(site) == [] and not Dataset.objects.exists()


def test_upload_of_a_version_with_another_schema_warns(client, site, steward):
    client.force_login(steward)
    _post(client, site=site.pk, slug="d", title="D", file=_csv("a.csv", b"a,b\n1,2\n"))
    dataset = Dataset.objects.get()

    response = _post(
        client,
        site=site.pk,
        dataset=dataset.pk,
        file=_csv("b.csv", b"a,c\nx,2\n"),
        follow=True,
    )

    page = response.content.decode()
    assert "different schema from version 1" in page
    assert "dropped b; added c; retyped a int→str" in page


def test_upload_of_a_version_with_the_same_schema_does_not_warn(client, site, steward):
    client.force_login(steward)
    _post(client, site=site.pk, slug="d", title="D", file=_csv("a.csv", b"a,b\n1,2\n"))
    dataset = Dataset.objects.get()

    response = _post(
        client, site=site.pk, dataset=dataset.pk, file=_csv("b.csv", b"a,b\n3,4\n"), follow=True
    )

    assert response.status_code == 200 and dataset.versions.filter(version=2).exists()
    assert "different schema" not in response.content.decode()


# --- missing-value markers: the command and the form agree (issue 10, point 7) -----------------

# A numeric column with empty cells and NA markers; row 5 has both.
MARKED = b"id,age,weight\n1,34,70.5\n2,NA,80\n3,,65\n4,51,NA\n5,NA,\n6,47,72\n"


def _ingest_marked(site, tmp_path, *extra) -> tuple[DatasetVersion, str]:
    path = tmp_path / "marked.csv"
    path.write_bytes(MARKED)
    err = StringIO()
    call_command(
        "dataset_ingest",
        str(path),
        "--site",
        site.slug,
        "--dataset",
        "marked",
        "--title",
        "Marked",
        *extra,
        stdout=StringIO(),
        stderr=err,
    )
    return DatasetVersion.objects.get(dataset__slug="marked"), err.getvalue()


def test_command_missing_adds_to_the_default_marker(site, tmp_path):
    dv, warnings = _ingest_marked(site, tmp_path, "--missing", "NA")
    assert dv.missing_values == ["", "NA"]
    assert {c["name"]: c["type"] for c in dv.schema} == {
        "id": "int",
        "age": "int",
        "weight": "float",
    }
    table = _load(dv)
    assert [x != x for x in table.data["age"].tolist()] == [False, True, True, False, True, False]
    assert [x != x for x in table.data["weight"].tolist()] == [
        False,
        False,
        False,
        True,
        True,
        False,
    ]
    assert warnings == ""


def test_command_no_default_missing_keeps_only_the_declared_markers(site, tmp_path):
    dv, warnings = _ingest_marked(site, tmp_path, "--no-default-missing", "--missing", "NA")
    assert dv.missing_values == ["NA"]
    # An empty cell is now a value, and not a number: both columns with one become text.
    assert {c["name"]: c["type"] for c in dv.schema}["age"] == "str"
    assert "column 'age' is read as text because 1 cell(s) are not numbers: '' (1)" in warnings


def test_command_reports_a_numeric_column_turned_text_by_an_undeclared_marker(site, tmp_path):
    dv, warnings = _ingest_marked(site, tmp_path)
    assert dv.missing_values == [""]
    types = {c["name"]: c["type"] for c in dv.schema}
    assert types["age"] == types["weight"] == "str"
    assert "column 'age' is read as text because 2 cell(s) are not numbers: 'NA' (2)" in warnings
    assert "column 'weight' is read as text because 1 cell(s) are not numbers: 'NA' (1)" in warnings
    profile = {c["name"]: c for c in dv.profile["columns"]}
    assert profile["age"]["not_numbers"] == "≤7"  # the profile holds only the suppressed count
    assert "not_numbers" not in profile["id"]


def test_profile_marks_identifier_like_columns(site, tmp_path):
    dv, _ = _ingest_marked(site, tmp_path, "--missing", "NA")
    profile = {c["name"]: c["identifier"] for c in dv.profile["columns"]}
    assert profile == {"id": True, "age": False, "weight": False}


def test_upload_form_and_command_give_the_same_markers(site):
    from sandbox.csvformat import missing_markers
    from sandbox.forms import DatasetUploadForm

    def form_markers(empty: bool, text: str) -> list[str]:
        data = {"site": site.pk, "slug": "x", "title": "X", "missing_markers": text}
        if empty:
            data["empty_is_missing"] = "on"
        form = DatasetUploadForm(
            data,
            {"file": _upload(b"a\n1\n")},
            sites=type(site).objects.filter(pk=site.pk),
            datasets=Dataset.objects.none(),
        )
        assert form.is_valid(), form.errors
        return form.cleaned_data["missing_values"]

    assert (
        form_markers(True, "NA\n-999")
        == list(missing_markers(["NA", "-999"]))
        == [
            "",
            "NA",
            "-999",
        ]
    )
    assert form_markers(False, "NA") == list(missing_markers(["NA"], defaults=False)) == ["NA"]


def _upload(content: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("x.csv", content, content_type="text/csv")

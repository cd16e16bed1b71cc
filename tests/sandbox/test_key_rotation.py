"""Site key rotation: ``site_key_rotate`` / ``manage.py site_key_rotate`` re-wraps every data key of
the site's versions, records the new object hashes, retires the old key; an interrupted rotation is
finished by running it again. On a real ``FilesystemStore`` and the real SeaweedFS S3 server."""

from __future__ import annotations

import hashlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from portal.models import AuditEvent, Membership, Role
from sandbox import services
from sandbox.keyring import SiteKeyring
from sandbox.loader import LoaderError, load_table
from sandbox.models import DatasetVersion
from sandbox.storage import FilesystemStore
from tests.factories import SiteFactory, UserFactory

pytestmark = pytest.mark.django_db


def _csv(tmp_path, name: str, rows: int):
    path = tmp_path / name
    path.write_text("x,label\n" + "".join(f"{i}.5,{'ab'[i % 2]}\n" for i in range(rows)))
    return path


def _world(tmp_path, *, store, keyring, site):
    """Three versions of two datasets at ``site``, ingested for real."""
    for slug, rows in (("a", 5), ("a", 7), ("b", 11)):
        services.dataset_ingest(
            by=None,
            site=site,
            path=_csv(tmp_path, f"{slug}{rows}.csv", rows),
            slug=slug,
            title=slug.upper(),
            store=store,
            keyring=keyring,
        )
    return list(DatasetVersion.objects.filter(dataset__site=site).order_by("pk"))


def _load(store, kek, dv):
    return load_table(
        store=store,
        kek=kek,
        store_key=dv.store_key,
        site=dv.dataset.site.slug,
        dataset=dv.dataset.slug,
        version=dv.version,
    )


def _object_sha(store, key) -> str:
    return hashlib.sha256(store.get_bytes(key)).hexdigest()


def _assert_rotated(store, keyring, site, versions, old_kek):
    new_kek = keyring.get(site.slug)
    assert new_kek != old_kek
    assert keyring.previous(site.slug) == []  # the old key is gone from the keyring
    for before in versions:
        dv = DatasetVersion.objects.get(pk=before.pk)
        assert _load(store, new_kek, dv).n_rows == dv.row_count
        with pytest.raises(LoaderError):
            _load(store, old_kek, dv)
        assert dv.ciphertext_sha256 == _object_sha(store, dv.store_key)
        assert dv.ciphertext_sha256 != before.ciphertext_sha256  # the header changed…
        assert dv.size_bytes == before.size_bytes  # …and only the header


@pytest.fixture
def fs_site(settings, tmp_path):
    settings.FRP_SITES_DIR = tmp_path / "sites"
    site = SiteFactory(slug="rot-site")
    (settings.FRP_SITES_DIR / site.slug).mkdir(parents=True)
    store = FilesystemStore(settings.FRP_SITES_DIR / site.slug / "store")
    keyring = SiteKeyring(settings.FRP_SITES_DIR / site.slug / "keyring")
    return site, store, keyring


def test_command_rotates_filesystem_site(fs_site, tmp_path):
    site, store, keyring = fs_site
    versions = _world(tmp_path, store=store, keyring=keyring, site=site)
    old_kek = keyring.get(site.slug)
    out = StringIO()
    call_command("site_key_rotate", site.slug, stdout=out)
    assert "3 version(s) re-wrapped, 0 already" in out.getvalue()
    _assert_rotated(store, keyring, site, versions, old_kek)
    event = AuditEvent.objects.get(action="site.key_rotate")
    assert event.data == {"rewrapped": 3, "already_done": 0, "resumed": False, "retired": [1]}


@pytest.mark.parametrize("crash_after_put", [False, True])
def test_interrupted_rotation_is_finished_by_a_rerun(
    fs_site, tmp_path, monkeypatch, crash_after_put
):
    """A crash at the second object (before, or after its new header was stored but before its row
    was updated); the rerun finishes without rotating again."""
    site, store, keyring = fs_site
    versions = _world(tmp_path, store=store, keyring=keyring, site=site)
    old_kek = keyring.get(site.slug)
    real = services.rewrap_object
    calls = []

    def crashing(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            if crash_after_put:
                real(*args, **kwargs)
            raise RuntimeError("power cut")
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "rewrap_object", crashing)
    with pytest.raises(RuntimeError, match="power cut"):
        services.site_key_rotate(by=None, site=site)
    monkeypatch.setattr(services, "rewrap_object", real)
    assert keyring.previous(site.slug) == [1]  # the old key is kept until the end
    new_kek = keyring.get(site.slug)

    out = services.site_key_rotate(by=None, site=site)

    assert out.resumed and out.retired == [1]
    assert (out.rewrapped, out.already_done) == ((1, 2) if crash_after_put else (2, 1))
    assert keyring.get(site.slug) == new_kek  # not rotated a second time
    _assert_rotated(store, keyring, site, versions, old_kek)


def test_rotation_on_real_s3(seaweed_s3, tmp_path, settings):
    settings.FRP_SITES_DIR = tmp_path / "no-local-sites"
    site = SiteFactory()
    store = seaweed_s3.store()
    keyring = SiteKeyring(tmp_path / "keyring")
    versions = _world(tmp_path, store=store, keyring=keyring, site=site)
    old_kek = keyring.get(site.slug)
    url = f"s3://{seaweed_s3.access_key}:{seaweed_s3.secret_key}@{seaweed_s3.endpoint}/{seaweed_s3.bucket}"
    out = StringIO()
    call_command(
        "site_key_rotate",
        site.slug,
        "--store",
        url,
        "--keyring",
        str(tmp_path / "keyring"),
        stdout=out,
    )
    assert "3 version(s) re-wrapped" in out.getvalue()
    _assert_rotated(store, keyring, site, versions, old_kek)


def test_rotation_refusals(fs_site, tmp_path, monkeypatch):
    site, store, keyring = fs_site
    _world(tmp_path, store=store, keyring=keyring, site=site)
    with pytest.raises(services.DatasetError, match="only a data steward"):
        services.site_key_rotate(by=UserFactory(), site=site)
    monkeypatch.setenv("FRP_KEK_ROT_SITE", "00" * 32)
    with pytest.raises(CommandError, match="FRP_KEK_ROT_SITE"):
        call_command("site_key_rotate", site.slug)
    monkeypatch.delenv("FRP_KEK_ROT_SITE")
    with pytest.raises(CommandError, match="no site 'nowhere'"):
        call_command("site_key_rotate", "nowhere")
    steward = UserFactory()
    Membership.objects.create(user=steward, institution=site.institution, role=Role.DATA_STEWARD)
    assert services.site_key_rotate(by=steward, site=site).rewrapped == 3


def test_object_no_key_opens_keeps_the_old_key(fs_site, tmp_path):
    """A version whose object was wrapped under a key the keyring no longer has: the rotation stops
    with the object's name and keeps the previous key, so nothing else becomes unreadable."""
    site, store, keyring = fs_site
    versions = _world(tmp_path, store=store, keyring=keyring, site=site)
    stray = SiteKeyring(tmp_path / "stray")
    stray.create(site.slug)
    services.dataset_ingest(
        by=None,
        site=site,
        path=_csv(tmp_path, "c.csv", 3),
        slug="c",
        title="C",
        store=store,
        keyring=stray,
    )
    with pytest.raises(services.KeyringError, match="rot-site/c/v1.csv.enc"):
        services.site_key_rotate(by=None, site=site)
    assert keyring.previous(site.slug) == [1]
    old = keyring.get_previous(site.slug, 1)
    assert (
        _load(store, keyring.get(site.slug), DatasetVersion.objects.get(pk=versions[0].pk)).n_rows
        == 5
    )
    assert old != keyring.get(site.slug)

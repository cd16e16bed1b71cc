"""Sites and their credentials (portal.sites) and the institution admin's *Sites & pools* page."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from portal import sites
from portal.models import AuditEvent, Role, Site, SiteCredential
from tests.factories import InstitutionFactory, MembershipFactory, SiteFactory, UserFactory

pytestmark = pytest.mark.django_db


def _admin(institution):
    user = UserFactory()
    MembershipFactory(user=user, institution=institution, role=Role.INSTITUTION_ADMIN)
    return user


def test_credential_authenticates_its_site_and_is_stored_hashed():
    site = SiteFactory()
    token = sites.site_credential_issue(by=None, site=site)
    assert token.startswith("frps_") and len(token) > 40
    assert sites.site_authenticate(token) == site
    cred = SiteCredential.objects.get(site=site)
    assert token not in {cred.token_sha256, cred.prefix} and cred.last_used_at is not None


def test_new_credential_revokes_the_previous_one():
    site = SiteFactory()
    old = sites.site_credential_issue(by=None, site=site)
    new = sites.site_credential_issue(by=None, site=site)
    assert sites.site_authenticate(new) == site
    with pytest.raises(sites.SiteError, match="unknown or revoked"):
        sites.site_authenticate(old)


@pytest.mark.parametrize("token", ["", "frps_nope", "Bearer x", "frps_" + "a" * 200])
def test_unknown_credential_refused(token):
    SiteFactory()
    with pytest.raises(sites.SiteError):
        sites.site_authenticate(token)


def test_revoked_site_refused_and_audited(eager_celery):
    site = SiteFactory()
    token = sites.site_credential_issue(by=None, site=site)
    sites.site_revoke(by=None, site=site)
    with pytest.raises(sites.SiteError):
        sites.site_authenticate(token)
    with pytest.raises(sites.SiteError, match="revoked"):
        sites.site_credential_issue(by=None, site=site)
    assert AuditEvent.objects.filter(action="site.revoke", target_id=str(site.pk)).count() == 1
    sites.site_revoke(by=None, site=site)  # idempotent
    assert AuditEvent.objects.filter(action="site.revoke").count() == 1


def test_admin_adds_a_site_on_the_page():
    inst = InstitutionFactory()
    client = Client()
    client.force_login(_admin(inst))
    url = reverse("portal:institution_sites", args=[inst.slug])
    response = client.post(url, {"slug": "hospital-z", "name": "Hospital Z"})
    assert response.status_code == 302
    site = Site.objects.get(slug="hospital-z")
    assert site.institution == inst
    page = client.get(url).content.decode()
    assert "hospital-z" in page and "Download site kit" in page


@pytest.mark.parametrize("slug", ["A", "bad slug", "-x-", "ab"])
def test_bad_site_id_is_an_inline_error(slug):
    inst = InstitutionFactory()
    client = Client()
    client.force_login(_admin(inst))
    response = client.post(reverse("portal:institution_sites", args=[inst.slug]), {"slug": slug})
    assert response.status_code == 400
    assert "invalid-feedback" in response.content.decode()
    assert not Site.objects.exists()


def test_taken_site_id_is_an_inline_error():
    inst = InstitutionFactory()
    SiteFactory(slug="hospital-q")
    client = Client()
    client.force_login(_admin(inst))
    response = client.post(
        reverse("portal:institution_sites", args=[inst.slug]), {"slug": "hospital-q"}
    )
    assert response.status_code == 400 and "is taken" in response.content.decode()


def test_other_institutions_admin_gets_404():
    site = SiteFactory()
    client = Client()
    client.force_login(_admin(InstitutionFactory()))
    for url in (
        reverse("portal:institution_site_revoke", args=[site.institution.slug, site.slug]),
        reverse("sites:kit", args=[site.slug]),
        reverse("sites:key_upload", args=[site.slug]),
    ):
        assert client.post(url).status_code == 404
    assert reverse("sites:node_state", args=[site.slug])
    assert client.get(reverse("sites:node_state", args=[site.slug])).status_code == 404
    site.refresh_from_db()
    assert not site.is_revoked and not SiteCredential.objects.exists()


def test_local_runtime_registration_recorded_once(tmp_path):
    from federation.models import SiteNode, SiteNodeStatus
    from federation.onboarding import site_node_record, site_nodes_state
    from frp_site import nodekey

    site = SiteFactory()
    first = nodekey.key_pair_create(tmp_path / "a.key")
    node = site_node_record(site=site, public_key=first, node_id="111")
    assert site_node_record(site=site, public_key=first, node_id="111") == node
    second = nodekey.key_pair_create(tmp_path / "b.key")
    site_node_record(site=site, public_key=second, node_id="222")
    states = dict(SiteNode.objects.values_list("node_id", "status"))
    assert states == {"111": SiteNodeStatus.UNREGISTERED, "222": SiteNodeStatus.REGISTERED}
    assert site_nodes_state(sites=[SiteFactory()])[0][0].state == "no key"  # asks no SuperLink

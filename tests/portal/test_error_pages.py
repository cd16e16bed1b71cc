"""Error pages: the portal's own 403 and 404 pages, in its layout, with a way back."""

import pytest
from django.urls import reverse

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_forbidden_page_is_the_portal_layout_with_the_reason(client):
    client.force_login(UserFactory())  # a member of nothing: not a data steward

    response = client.get(reverse("sandbox:dataset_upload"))

    assert response.status_code == 403
    page = response.content.decode()
    assert "You may not do this" in page
    assert "Federated Research Portal" in page and reverse("portal:dashboard") in page


def test_not_found_page_is_the_portal_layout(client, settings):
    settings.DEBUG = False
    client.force_login(UserFactory())

    response = client.get("/no/such/page/")

    assert response.status_code == 404
    page = response.content.decode()
    assert "Not found" in page and "Back to the dashboard" in page
    assert "Federated Research Portal" in page  # the portal's layout, with its navigation

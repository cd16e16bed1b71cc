"""Pages name a person who is gone (a nullable ``created_by`` / ``requested_by``) without a 500.

Found by ``benchmarks/pages.py`` (issue 12): a dataset version registered by nobody (``created_by``
``NULL``, as after the account's deletion) made the dataset page raise ``VariableDoesNotExist``
(``default:v.created_by.username`` resolves its argument strictly), as did a request whose
requester is gone on the steward's queue.
"""

from __future__ import annotations

import pytest

from portal.models import Membership, Role
from tests.factories import DatasetVersionFactory, GrantFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_dataset_page_names_a_version_registered_by_nobody(client):
    first = DatasetVersionFactory(created_by=None)
    DatasetVersionFactory(dataset=first.dataset, version=2, created_by=None)  # the history shows
    version = first
    client.force_login(UserFactory())

    response = client.get(f"/datasets/{version.dataset_id}/")

    assert response.status_code == 200
    assert "site operator" in response.content.decode()


def test_steward_queue_shows_a_request_whose_requester_is_gone(client):
    version = DatasetVersionFactory()
    steward = UserFactory()
    Membership.objects.create(
        user=steward, institution=version.dataset.site.institution, role=Role.DATA_STEWARD
    )
    GrantFactory(dataset=version.dataset, requested_by=None, status="pending")
    client.force_login(steward)

    response = client.get("/access-requests/")

    assert response.status_code == 200
    assert "a former user" in response.content.decode()

"""Issue 9, finding 5: exact row counts undid the profile's disclosure control.

Reproduced on main: a 3-row dataset's pages said "3 rows" while its profile said "≤7". Researchers
now see row counts (and no byte sizes, which track them) under the profile's rule
(``sandbox.profile.safe_count``: 1–7 → "≤7", else rounded to 5); the dataset's stewards see exact.
"""

from __future__ import annotations

import re

import pytest

from portal.models import Membership, ProjectRole, Role
from tests.factories import (
    DatasetVersionFactory,
    GrantFactory,
    ProjectFactory,
    ProjectMemberFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    tiny = DatasetVersionFactory(row_count=3, size_bytes=777, dataset__title="Tiny cohort")
    large = DatasetVersionFactory(row_count=1233, dataset__title="Large cohort")
    steward = UserFactory()
    Membership.objects.create(
        user=steward, institution=tiny.dataset.site.institution, role=Role.DATA_STEWARD
    )
    project = ProjectFactory()
    researcher = ProjectMemberFactory(project=project, role=ProjectRole.PRINCIPAL_INVESTIGATOR).user
    for v in (tiny, large):
        GrantFactory(project=project, dataset=v.dataset)
    return {"tiny": tiny, "large": large, "steward": steward, "researcher": researcher}


def _text(response) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_researchers_see_row_counts_under_the_profiles_rule(client, world):
    client.force_login(world["researcher"])

    listing = _text(client.get("/datasets/"))
    tiny = client.get(f"/datasets/{world['tiny'].dataset_id}/")
    large = _text(client.get(f"/datasets/{world['large'].dataset_id}/"))
    form = _text(client.get("/jobs/new/"))

    assert re.search(r"Tiny cohort [^≈]*? site-\d+ 1 ≤7 3 ", listing)  # v1, ≤7 rows, 3 columns
    assert "≈1,235" in listing  # 1233 rounds to 1235
    page = _text(tiny)
    assert "≤7 rows" in page and "3 rows" not in page and "≤7 × 3" in page
    assert "777" not in tiny.content.decode()  # the object's size tracks the row count
    assert "≈1,235 rows" in large and "1233" not in large and "1,233" not in large
    assert "≤7 rows" in form and "≈1,235 rows" in form and "3 rows" not in form


def test_the_datasets_own_stewards_see_exact_figures(client, world):
    client.force_login(world["steward"])

    page = _text(client.get(f"/datasets/{world['tiny'].dataset_id}/"))
    other = _text(client.get(f"/datasets/{world['large'].dataset_id}/"))

    assert "3 rows" in page and "3 × 3" in page and "777 bytes" in page
    assert "≈1,235 rows" in other  # another institution's dataset: the rule applies

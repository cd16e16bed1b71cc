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


def test_profile_figures_are_written_to_their_three_significant_figures(client, world):
    """The header says "numbers to 3 significant figures": 105.0 is written 105, 1200.0 1,200
    (a new user read "105.0" and "1200.0" as more precise than the profile is)."""
    from sandbox.templatetags.sandbox_tags import significant

    assert [significant(v) for v in (105.0, 1200.0, 0.0123, 2.5, -47.0, 0.0, None, "x")] == [
        "105",
        "1,200",
        "0.0123",
        "2.50",
        "-47.0",
        "0",
        "—",
        "—",
    ]
    assert significant(float("nan")) == "—" and significant(float("inf")) == "—"
    version = world["large"]
    version.profile = {
        "columns": [{"name": "area", "type": "float", "missing": 0, "mean": 1200.0, "std": 105.0}]
    }
    version.save()
    client.force_login(world["researcher"])
    page = _text(client.get(f"/datasets/{version.dataset_id}/"))
    assert "mean 1,200 · sd 105" in page and "1200.0" not in page


def test_without_a_project_the_page_says_how_to_request_instead_of_an_empty_form(client, world):
    client.force_login(world["steward"])  # a steward in no project
    page = client.get(f"/datasets/{world['tiny'].dataset_id}/").content.decode()
    assert 'data-testid="no-project"' in page and 'name="purpose"' not in page
    client.force_login(world["researcher"])
    page = client.get(f"/datasets/{world['tiny'].dataset_id}/").content.decode()
    assert 'name="purpose"' in page and 'data-testid="no-project"' not in page

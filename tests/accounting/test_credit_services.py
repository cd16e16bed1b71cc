"""Credit services and selectors on PostgreSQL: the draft from a job's data, its idempotency, the
PI's edit and its validation, the ``credit.view``/``credit.edit`` permissions."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction

from accounting.models import CreditContributor, CreditStatement
from accounting.selectors.credit import credit_draft_lines, credit_for_job, credit_jobs_for_user
from accounting.services.credit import (
    CreditError,
    credit_statement_draft,
    credit_statement_update,
)
from portal.models import AuditEvent, ProjectMember, ProjectRole
from portal.permissions import can
from tests.accounting.credit_world import add_site, build_credit_world, score
from tests.factories import SiteFactory

pytestmark = pytest.mark.django_db

DATA = ("data-curation", "resources")
SUBMITTER = ("investigation", "methodology", "software")
PI = ("project-administration", "supervision")


@pytest.fixture
def world():
    return build_credit_world()


@pytest.fixture
def scored(world):
    """Exact whole-run shares A 0.23, B 0.42, C 0.35, plus decoys the draft must not use."""
    for k, share in {"A": 0.23, "B": 0.42, "C": 0.35}.items():
        score(world.job, world.sites[k], share)
        score(world.job, world.sites[k], 1 / 3, method="gtg")  # exact wins over GTG
        score(world.job, world.sites[k], 0.9 if k == "A" else 0.05, round=2)  # a round, not the run
    return world


def _rows(statement) -> list[tuple]:
    return [
        (c.name, c.kind, tuple(c.roles), c.share, c.share_method, c.position)
        for c in statement.contributors.order_by("position")
    ]


def _edit_rows(statement) -> list[dict]:
    return [
        {"id": c.pk, "name": c.name, "kind": c.kind, "roles": list(c.roles), "share": c.share}
        for c in statement.contributors.order_by("position")
    ]


# ---------------------------------------------------------------------------------------------
# Draft
# ---------------------------------------------------------------------------------------------


def test_draft_three_sites_known_shares(scored):
    statement = credit_statement_draft(job=scored.job)

    assert _rows(statement) == [
        ("Ada Lovelace", "person", SUBMITTER, None, "", 0),
        ("Grace Hopper", "person", PI, None, "", 1),
        ("Hospital B", "institution", DATA, 0.42, "exact", 2),
        ("Hospital C", "institution", DATA, 0.35, "exact", 3),
        ("Hospital A", "institution", DATA, 0.23, "exact", 4),
    ]
    links = list(statement.contributors.values_list("user__username", "institution__slug"))
    assert links == [
        ("ada", None),
        ("grace", None),
        (None, "hospital-b"),
        (None, "hospital-c"),
        (None, "hospital-a"),
    ]


def test_draft_falls_back_to_gtg_then_data_volume(world):
    for k, share in {"A": 0.5, "B": 0.3, "C": 0.2}.items():
        score(world.job, world.sites[k], share, method="data_volume")
    lines = credit_draft_lines(job=world.job)
    assert [(x.name, x.share, x.share_method) for x in lines[2:]] == [
        ("Hospital A", 0.5, "data_volume"),
        ("Hospital B", 0.3, "data_volume"),
        ("Hospital C", 0.2, "data_volume"),
    ]

    for k, share in {"A": 0.1, "B": 0.6, "C": 0.3}.items():
        score(world.job, world.sites[k], share, method="gtg")
    lines = credit_draft_lines(job=world.job)

    assert [(x.name, x.share, x.share_method) for x in lines[2:]] == [
        ("Hospital B", 0.6, "gtg"),
        ("Hospital C", 0.3, "gtg"),
        ("Hospital A", 0.1, "gtg"),
    ]


def test_draft_without_scores_has_no_shares_and_says_so(world):
    view = credit_for_job(job=world.job)

    assert view.is_preview
    assert [(x.name, x.share) for x in view.lines[2:]] == [
        ("Hospital A", None),
        ("Hospital B", None),
        ("Hospital C", None),
    ]
    assert view.share_note == "Contribution shares are not measured yet."
    assert view.paragraph.endswith(
        "Resources: Hospital A, Hospital B, Hospital C. Software: Ada Lovelace. "
        "Supervision: Grace Hopper. Contribution shares are not measured yet."
    )


def test_draft_sums_sites_of_one_institution(scored):
    second = SiteFactory(institution=scored.hospitals["C"], slug="site-c2")
    add_site(scored.job, second)
    score(scored.job, second, 0.1)  # shares of a method need not sum to 1 here

    lines = credit_draft_lines(job=scored.job)

    assert [(x.name, x.share) for x in lines[2:]] == [
        ("Hospital C", 0.45),  # 0.35 + 0.1, ahead of B's 0.42
        ("Hospital B", 0.42),
        ("Hospital A", 0.23),
    ]


def test_draft_pi_who_submitted_gets_one_line_with_both_role_sets(world):
    ProjectMember.objects.filter(project=world.project, user=world.users["alan"]).update(
        role=ProjectRole.PRINCIPAL_INVESTIGATOR
    )
    world.job.submitted_by = world.users["grace"]
    world.job.save()

    lines = credit_draft_lines(job=world.job)

    assert [(x.name, x.roles) for x in lines[:2]] == [
        (
            "Grace Hopper",
            ("investigation", "methodology", "project-administration", "software", "supervision"),
        ),
        ("Alan Turing", PI),
    ]


def test_draft_twice_writes_once(scored):
    first = credit_statement_draft(job=scored.job)
    pks = list(first.contributors.values_list("pk", flat=True))

    second = credit_statement_draft(job=scored.job)

    assert second.pk == first.pk
    assert list(second.contributors.values_list("pk", flat=True)) == pks
    assert AuditEvent.objects.filter(action="credit.draft").count() == 1
    assert CreditStatement.objects.count() == 1


def test_draft_refreshes_unedited_statement_when_scores_arrive(world):
    statement = credit_statement_draft(job=world.job)
    assert [c.share for c in statement.contributors.all()][2:] == [None, None, None]
    for k, share in {"A": 0.23, "B": 0.42, "C": 0.35}.items():
        score(world.job, world.sites[k], share)

    credit_statement_draft(job=world.job)

    assert [row[3] for row in _rows(statement)][2:] == [0.42, 0.35, 0.23]
    event = AuditEvent.objects.filter(action="credit.draft").first()
    assert event.data["refreshed"] is True
    assert event.institution.slug == "northern"


def test_draft_leaves_a_pi_edited_statement_alone(scored):
    statement = credit_statement_draft(job=scored.job)
    rows = _edit_rows(statement)
    rows[1]["roles"] = ["conceptualization", "supervision", "writing-original-draft"]
    credit_statement_update(by=scored.users["grace"], statement=statement, contributors=rows)
    edited = _rows(statement)
    events = AuditEvent.objects.filter(action="credit.draft").count()

    again = credit_statement_draft(job=scored.job)

    assert again.pk == statement.pk
    assert _rows(again) == edited
    assert _rows(again)[1][2] == ("conceptualization", "supervision", "writing-original-draft")
    assert AuditEvent.objects.filter(action="credit.draft").count() == events


# ---------------------------------------------------------------------------------------------
# The PI's edit
# ---------------------------------------------------------------------------------------------


def test_update_by_pi_replaces_rows_keeps_links_and_audits(scored):
    statement = credit_statement_draft(job=scored.job)
    rows = _edit_rows(statement)
    ada, grace, b, c, a = rows
    b["share"] = 0.5  # the PI changes B's share
    new = {
        "id": None,
        "name": "Wellcome Trust",
        "kind": "institution",
        "roles": ["funding-acquisition"],
        "share": None,
    }

    credit_statement_update(
        by=scored.users["grace"], statement=statement, contributors=[grace, ada, b, a, new]
    )

    statement.refresh_from_db()
    assert statement.edited_by == scored.users["grace"]
    assert statement.edited_at is not None
    assert _rows(statement) == [
        ("Grace Hopper", "person", PI, None, "", 0),
        ("Ada Lovelace", "person", SUBMITTER, None, "", 1),
        ("Hospital B", "institution", DATA, 0.5, "pi", 2),
        ("Hospital A", "institution", DATA, 0.23, "exact", 3),  # unchanged share keeps its method
        ("Wellcome Trust", "institution", ("funding-acquisition",), None, "", 4),
    ]
    kept = statement.contributors.get(name="Hospital B")
    assert kept.pk == b["id"] and kept.institution == scored.hospitals["B"]
    assert not statement.contributors.filter(name="Hospital C").exists()
    event = AuditEvent.objects.get(action="credit.edit")
    assert event.actor == scored.users["grace"]
    assert [x["name"] for x in event.data["before"]] == [
        "Ada Lovelace",
        "Grace Hopper",
        "Hospital B",
        "Hospital C",
        "Hospital A",
    ]
    assert event.data["after"][2] == {"name": "Hospital B", "roles": list(DATA), "share": 0.5}


@pytest.mark.parametrize("who", ["ada", "alan", "bea", "uma", "root", "olga"])
def test_update_by_non_pi_refused_and_nothing_written(scored, who):
    statement = credit_statement_draft(job=scored.job)
    before = _rows(statement)
    rows = _edit_rows(statement)[:1]

    with pytest.raises(PermissionDenied):
        credit_statement_update(by=scored.users[who], statement=statement, contributors=rows)

    assert _rows(statement) == before
    assert not AuditEvent.objects.filter(action="credit.edit").exists()


def _attempt(world, statement, mutate):
    rows = _edit_rows(statement)
    mutate(rows)
    with pytest.raises(CreditError) as info:
        credit_statement_update(by=world.users["grace"], statement=statement, contributors=rows)
    return info.value


@pytest.mark.parametrize(
    ("mutate", "row", "field", "message"),
    [
        (
            lambda r: r[0].update(roles=["software", "typing"]),
            0,
            "roles",
            "Not CRediT roles: typing.",
        ),
        (lambda r: r[1].update(roles=[]), 1, "roles", "Choose at least one role."),
        (lambda r: r[2].update(share=1.5), 2, "share", "A share is between 0 % and 100 %."),
        (lambda r: r[2].update(share=-0.1), 2, "share", "A share is between 0 % and 100 %."),
        (lambda r: r[3].update(name="  "), 3, "name", "Give the contributor's name."),
        (lambda r: r[4].update(name="hospital b"), 4, "name", "Already listed in row 3."),
        (lambda r: r[0].update(kind="robot"), 0, "kind", "Choose person or institution."),
        (
            lambda r: r[0].update(id=10**9),
            0,
            "id",
            "This contributor is not part of the statement.",
        ),
        (  # hostile re-test F5: the first row's contributor was removed unseen
            lambda r: r[1].update(id=r[0]["id"]),
            1,
            "id",
            "The same contributor as row 1: reload the page.",
        ),
    ],
)
def test_update_invalid_row_rejected_nothing_written(scored, mutate, row, field, message):
    statement = credit_statement_draft(job=scored.job)
    before = _rows(statement)

    error = _attempt(scored, statement, mutate)

    assert error.row_errors == {row: {field: [message]}}
    assert _rows(statement) == before
    statement.refresh_from_db()
    assert statement.edited_at is None


def test_update_shares_over_100_percent_rejected(scored):
    statement = credit_statement_draft(job=scored.job)

    error = _attempt(scored, statement, lambda r: r[0].update(share=0.2))  # 0.2 + 1.0

    assert error.errors == ["The shares add up to 120.0 %; at most 100 %."]


def test_update_empty_statement_rejected(scored):
    statement = credit_statement_draft(job=scored.job)

    error = _attempt(scored, statement, lambda r: r.clear())

    assert error.errors == ["A statement needs at least one contributor."]


def test_share_outside_0_1_refused_by_database(scored):
    statement = credit_statement_draft(job=scored.job)

    with pytest.raises(IntegrityError), transaction.atomic():
        CreditContributor.objects.create(
            statement=statement, name="x", roles=["software"], share=1.2
        )


# ---------------------------------------------------------------------------------------------
# Permissions and scoping
# ---------------------------------------------------------------------------------------------

READERS = {"ada", "grace", "alan", "bea", "uma", "root"}


@pytest.mark.parametrize("who", ["ada", "grace", "alan", "olga", "bea", "uma", "ian", "root"])
def test_credit_view_members_involved_admins_and_platform_admins(world, who):
    assert can(world.users[who], "credit.view", world.job) is (who in READERS)
    assert credit_jobs_for_user(user=world.users[who]).filter(pk=world.job.pk).exists() is (
        who in READERS
    )


@pytest.mark.parametrize("who", ["ada", "grace", "alan", "olga", "bea", "uma", "ian", "root"])
def test_credit_edit_pi_only(world, who):
    assert can(world.users[who], "credit.edit", world.job) is (who == "grace")


def test_credit_inactive_pi_refused(world):
    grace = world.users["grace"]
    grace.is_active = False
    grace.save()

    assert can(grace, "credit.view", world.job) is False
    assert can(grace, "credit.edit", world.job) is False

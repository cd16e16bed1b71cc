"""The run of each usage record and billing line on the job page (usage and cost cards) and the
invoice page: a "Run" column only for a job with more than one run (ADR 0028), hand-built rows."""

from __future__ import annotations

import datetime as dt
import html
import re
from decimal import Decimal

import pytest
from django.urls import reverse

from accounting.models import BillingEntry, Invoice
from portal.models import Membership, ProjectMember, ProjectRole, Role
from tests.factories import (
    BillingJobFactory,
    BillingUsageFactory,
    InstitutionFactory,
    ProjectFactory,
    SiteFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db
D = Decimal
FIRST, SECOND = "9081726354453627181", "1234567890123456789"  # Flower run ids (uint64)


@pytest.fixture
def world():
    return run_world()


def run_world() -> dict:
    """An institution paying for a project's jobs at another institution's site, its November
    invoice, a project member and an admin of the payer."""
    payer = InstitutionFactory(slug="inst-p", name="Payer")
    host = InstitutionFactory(slug="inst-h", name="Host")
    site = SiteFactory(institution=host, slug="site-h")
    project = ProjectFactory(institution=payer)
    invoice = Invoice.objects.create(institution=payer, month=dt.date(2026, 11, 1))
    member = UserFactory()
    ProjectMember.objects.create(project=project, user=member, role=ProjectRole.MEMBER)
    admin = UserFactory()
    Membership.objects.create(user=admin, institution=payer, role=Role.INSTITUTION_ADMIN)
    return {"site": site, "project": project, "invoice": invoice, "payer": payer,
            "member": member, "admin": admin}  # fmt: skip


def _job(world, runs: list[str]):
    """A completed job that ran under the Flower run ids ``runs`` (the last is its current run),
    with a usage record and a compute charge per run at the world's site."""
    job = BillingJobFactory(
        project=world["project"],
        title="Resumable",
        earlier_runs=runs[:-1],
        flower_run_id=runs[-1],
        resume_round=2 if len(runs) > 1 else 0,
    )
    for run, flower_id in enumerate(runs, start=1):
        BillingUsageFactory(
            job=job, site=world["site"], run=run, flower_run_id=flower_id, rounds=run + 1
        )
        BillingEntry.objects.create(
            job=job,
            site=world["site"],
            kind="compute_charge",
            run=run,
            institution=world["payer"],
            service_units=D(run),
            amount=D("0.05") * run,
            invoice=world["invoice"],
        )
    return job


def _section(page: str, element_id: str) -> str:
    start = page.index(f'id="{element_id}"')
    return html.unescape(page[start : page.index("</table>", start)])


def _cells(table: str, tag: str = "td") -> list[str]:
    return [
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", c)).strip()
        for c in re.findall(rf"<{tag}\b[^>]*>(.*?)</{tag}>", table, re.S)
    ]


def _job_page(client, world, job) -> str:
    client.force_login(world["member"])
    response = client.get(reverse("federation:job_detail", args=[job.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_usage_of_a_resumed_job_names_each_records_run(client, world):
    job = _job(world, [FIRST, SECOND])

    usage = _section(_job_page(client, world, job), "usage")

    assert _cells(usage, "th")[:3] == ["Site", "Run", "Rounds"]
    assert "run 1 of 2 (Flower run 90817263…)" in _cells(usage)
    assert "run 2 of 2 (Flower run 12345678…)" in _cells(usage)
    assert f'title="Flower run {FIRST}"' in usage  # the whole id on hover


def test_cost_card_of_a_resumed_job_names_each_compute_lines_run(client, world):
    job = _job(world, [FIRST, SECOND])

    cost = _section(_job_page(client, world, job), "job-cost")

    assert _cells(cost, "th")[:2] == ["Site", "Run"]
    cells = _cells(cost)
    assert cells.index("run 1 of 2 (Flower run 90817263…)") < cells.index(
        "run 2 of 2 (Flower run 12345678…)"
    )


def test_invoice_lines_of_a_resumed_job_name_their_run(client, world):
    _job(world, [FIRST, SECOND])
    client.force_login(world["admin"])

    page = client.get(reverse("accounting:invoice_detail", args=[world["invoice"].pk]))

    lines = html.unescape(page.content.decode())
    assert "<th>Run</th>" in lines
    assert "run 1 of 2 (Flower run 90817263…)" in _cells(lines)
    assert "run 2 of 2 (Flower run 12345678…)" in _cells(lines)


def test_pages_of_a_job_with_one_run_have_no_run_column(client, world):
    job = _job(world, [FIRST])

    page = _job_page(client, world, job)
    client.force_login(world["admin"])
    invoice = client.get(reverse("accounting:invoice_detail", args=[world["invoice"].pk]))

    assert "Run" not in _cells(_section(page, "usage"), "th")
    assert "Run" not in _cells(_section(page, "job-cost"), "th")
    assert "<th>Run</th>" not in invoice.content.decode()
    assert "run 1 of 1" not in page and "run 1 of 1" not in invoice.content.decode()


def test_invoice_csv_names_each_lines_run_and_flower_run(client, world):
    _job(world, [FIRST, SECOND])
    client.force_login(world["admin"])

    response = client.get(reverse("accounting:invoice_csv", args=[world["invoice"].pk]))

    text = b"".join(response.streaming_content).decode()
    header, *rows = text.strip().splitlines()
    assert header.split(",")[-2:] == ["run", "flower_run"]
    assert [r.split(",")[-2:] for r in rows] == [["1", FIRST], ["2", SECOND]]

"""Billing pages: who may see them (another institution's admin gets 404), what they show, the
CSV export's content and its formula-injection neutralisation, the price-rule form and the job
page's cost card."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
from decimal import Decimal

import pytest
from django.template import Context, Template
from django.urls import reverse
from django.utils import timezone

from accounting.models import Invoice, PriceRule
from accounting.services import billing
from federation.models import JobSite
from portal.models import Membership, ProjectMember, ProjectRole, Role
from tests.accounting.test_billing import MARCH, ThreePools, _bill_month
from tests.factories import DatasetVersionFactory, UserFactory

pytestmark = pytest.mark.django_db
D = Decimal


def _admin(inst):
    user = UserFactory()
    Membership.objects.create(user=user, institution=inst, role=Role.INSTITUTION_ADMIN)
    return user


@pytest.fixture
def world():
    w = ThreePools()
    w.jobs = _bill_month(w)
    w.admins = {name: _admin(inst) for name, inst in w.inst.items()}
    return w


def _invoice(w, name, month=MARCH):
    return Invoice.objects.get(institution=w.inst[name], month=month)


# --- permissions -------------------------------------------------------------------------------


@pytest.mark.parametrize("page", ["detail", "csv"])
def test_another_institutions_admin_cannot_see_an_invoice(client, world, page):
    invoice = _invoice(world, "A")
    url = reverse(f"accounting:invoice_{page}", args=[invoice.pk])

    client.force_login(world.admins["B"])
    assert client.get(url).status_code == 404
    client.force_login(world.admins["A"])
    assert client.get(url).status_code == 200


def test_billing_pages_refuse_researchers_and_other_admins(client, world):
    researcher = UserFactory()
    Membership.objects.create(user=researcher, institution=world.inst["A"], role=Role.RESEARCHER)
    urls = [
        reverse("accounting:institution_billing", args=["inst-a"]),
        reverse("accounting:institution_prices", args=["inst-a"]),
        reverse("accounting:invoice_detail", args=[_invoice(world, "A").pk]),
    ]
    for user in (researcher, world.admins["C"]):
        client.force_login(user)
        assert [client.get(u).status_code for u in urls] == [404, 404, 404]
    client.logout()
    assert all(client.get(u).status_code == 302 for u in urls)  # to the sign-in page


def test_platform_admin_sees_every_institutions_billing(client, world):
    client.force_login(UserFactory(is_staff=True))
    assert client.get(reverse("accounting:institution_billing", args=["inst-c"])).status_code == 200
    assert client.get(reverse("accounting:invoice_detail", args=[_invoice(world, "C").pk])).status_code == 200  # fmt: skip


# --- pages -------------------------------------------------------------------------------------


def test_billing_page_shows_invoices_and_monthly_series(client, world):
    client.force_login(world.admins["B"])

    response = client.get(reverse("accounting:institution_billing", args=["inst-b"]))

    assert response.status_code == 200
    page = response.content.decode()
    assert "March 2025" in page and "1.63 EUR" in page and "1.29 EUR" in page
    assert reverse("accounting:invoice_csv", args=[_invoice(world, "B").pk]) in page
    assert "Institution A" not in page  # nothing of A's invoices
    series = json.loads(
        page.split('id="billing-series" type="application/json">')[1].split("</script>")[0]
    )
    assert series["labels"][-1] == timezone.localdate().strftime("%Y-%m")
    assert len(series["labels"]) == 12
    # the 12 months to today may not include March 2025; when they do, check B's values:
    if "2025-03" in series["labels"]:
        i = series["labels"].index("2025-03")
        assert series["charges"][i] == 1.63 and series["credits"][i] == 1.29
        assert series["net"][i] == 0.34


def test_billing_series_by_hand(world):
    from accounting.selectors.billing import institution_billing_series

    series = institution_billing_series(
        institution=world.inst["B"], today=dt.date(2025, 4, 15), months=3
    )

    assert series["labels"] == ["2025-02", "2025-03", "2025-04"]
    # B's project used J2: @C 8 cores × 2 h = 16 core-h, @A 1 core × 1/3 h = 0.333 core-h.
    assert series["core_hours_used"] == [0.0, 16.333, 0.0]
    # B's site provided J1@B 4 × 1.5 = 6 core-h and J3@B 2 × 10000/3600 = 5.5556 core-h:
    # 11.5556 → 11.556 (chart: 3 dp).
    assert series["core_hours_provided"] == [0.0, 11.556, 0.0]
    assert series["su_used"] == [0.0, 48.5, 0.0]  # 48 + 0.5
    assert series["su_provided"] == [0.0, 32.333, 0.0]  # 24 + 8.3333 → 3 dp
    assert series["charges"] == [0.0, 1.63, 0.0] and series["credits"] == [0.0, 1.29, 0.0]
    assert series["currency"] == "EUR"


def test_billing_series_months_start_at_midnight_in_the_portals_zone(world):
    """The series' months are the portal zone's (as ``__date`` was before issue 12): a job that
    finished at 23:30 UTC on 31 January finished on 1 February in Berlin."""
    from accounting.selectors.billing import institution_billing_series

    job = world.jobs["J2"]  # B's project's job: 16.333 core-h, 48.5 SU
    job.finished_at = dt.datetime(2025, 1, 31, 23, 30, tzinfo=dt.UTC)
    job.save(update_fields=["finished_at"])

    def series(zone):
        with timezone.override(zone):
            return institution_billing_series(
                institution=world.inst["B"], today=dt.date(2025, 4, 15), months=3
            )

    berlin, utc = series("Europe/Berlin"), series("UTC")

    assert berlin["core_hours_used"] == [16.333, 0.0, 0.0]
    assert berlin["su_used"] == [48.5, 0.0, 0.0]
    assert utc["core_hours_used"] == [0.0, 0.0, 0.0]  # January: before the series
    assert utc["su_used"] == [0.0, 0.0, 0.0]


def test_invoice_detail_lists_lines_and_totals(client, world):
    client.force_login(world.admins["B"])

    response = client.get(reverse("accounting:invoice_detail", args=[_invoice(world, "B").pk]))

    assert response.status_code == 200
    page = response.content.decode()
    assert [line.kind for line in response.context["page_obj"]] == [
        "compute_credit",  # J1 @ site-b
        "compute_charge",  # J2 @ site-a
        "compute_charge",  # J2 @ site-c
        "compute_credit",  # J3 @ site-b
    ]
    for text in ("+1.60 EUR", "+0.03 EUR", "−0.96 EUR", "−0.33 EUR", "0.34 EUR", "Open"):
        assert text in page
    assert "48.0000" in page and "8.3333" in page


def test_invoice_csv_content(client, world):
    job = world.jobs["J2"]
    job.title = '=HYPERLINK("http://evil.example","x")'
    job.save(update_fields=["title"])
    invoice = _invoice(world, "B")
    client.force_login(world.admins["B"])

    response = client.get(reverse("accounting:invoice_csv", args=[invoice.pk]))

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert 'filename="invoice-inst-b-2025-03.csv"' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    got = [(r["job"], r["site"], r["kind"], r["service_units"], r["amount"], r["signed_amount"]) for r in rows]  # fmt: skip
    j1, j2, j3 = (str(world.jobs[k].pk) for k in ("J1", "J2", "J3"))
    assert got == [
        (j1, "site-b", "compute_credit", "24.0000", "0.96", "-0.96"),
        (j2, "site-a", "compute_charge", "0.5000", "0.03", "0.03"),
        (j2, "site-c", "compute_charge", "48.0000", "1.60", "1.60"),
        (j3, "site-b", "compute_credit", "8.3333", "0.33", "-0.33"),
    ]
    assert sum(D(r["signed_amount"]) for r in rows) == invoice.total == D("0.34")
    j2_rows = [r for r in rows if r["job"] == j2]
    assert all(r["job_title"] == "'" + job.title for r in j2_rows)  # neutralised formula
    assert {r["price_per_unit"] for r in j2_rows} == {"0.0500", "0.0333"}
    assert {r["institution"] for r in rows} == {"Institution B"}


# --- price rules -------------------------------------------------------------------------------


def test_prices_page_shows_rule_history(client, world):
    pool = world.pool["A"]
    PriceRule.objects.create(pool=pool, effective_from=dt.date(2099, 1, 1), price_per_unit=D("0.07"))  # fmt: skip
    client.force_login(world.admins["A"])

    response = client.get(reverse("accounting:institution_prices", args=["inst-a"]))

    assert response.status_code == 200
    page = response.content.decode()
    assert "2099-01-01" in page and "scheduled" in page and "in effect" in page
    assert "pool-b" not in page  # only A's pools


def test_price_rule_form_saves_a_rule(client, world):
    client.force_login(world.admins["A"])
    url = reverse("accounting:institution_prices", args=["inst-a"])
    day = timezone.localdate() + dt.timedelta(days=3)

    response = client.post(
        url,
        {
            "pool": world.pool["A"].pk,
            "effective_from": day.isoformat(),
            "cpu_weight": "1",
            "memory_weight": "0.25",
            "gpu_weight": "8",
            "price_per_unit": "0.045",
            "currency": "EUR",
            "data_credit_rate": "0.1",
        },
    )

    assert response.status_code == 302 and response["Location"] == url
    rule = PriceRule.objects.get(pool=world.pool["A"], effective_from=day)
    assert (rule.gpu_weight, rule.price_per_unit, rule.created_by) == (
        D("8"),
        D("0.045"),
        world.admins["A"],
    )


def test_price_rule_form_shows_inline_errors(client, world):
    client.force_login(world.admins["A"])
    url = reverse("accounting:institution_prices", args=["inst-a"])

    response = client.post(
        url,
        {
            "pool": world.pool["B"].pk,  # another institution's pool
            "effective_from": "2024-01-01",
            "cpu_weight": "-1",
            "memory_weight": "0",
            "gpu_weight": "0",
            "price_per_unit": "abc",
            "currency": "USD",
            "data_credit_rate": "2",
        },
    )

    assert response.status_code == 200
    form = response.context["form"]
    assert set(form.errors) == {
        "pool",
        "effective_from",
        "cpu_weight",
        "price_per_unit",
        "currency",
        "data_credit_rate",
    }
    assert "is-invalid" in response.content.decode()
    assert PriceRule.objects.count() == 3


def test_price_rule_form_reports_service_errors_inline(client, world):
    client.force_login(world.admins["A"])
    url = reverse("accounting:institution_prices", args=["inst-a"])
    day = (timezone.localdate() + dt.timedelta(days=1)).isoformat()
    data = {
        "pool": world.pool["A"].pk,
        "effective_from": day,
        "cpu_weight": "0",
        "memory_weight": "0",
        "gpu_weight": "0",
        "price_per_unit": "0.05",
        "currency": "EUR",
        "data_credit_rate": "0",
    }

    response = client.post(url, data)

    assert response.status_code == 200
    assert "At least one billing weight" in response.context["form"].errors["__all__"][0]
    assert "At least one billing weight" in response.content.decode()

    client.post(url, data | {"cpu_weight": "1"})
    response = client.post(url, data | {"cpu_weight": "2"})  # the same day again
    assert "already has a price rule" in response.context["form"].errors["effective_from"][0]
    assert PriceRule.objects.filter(pool=world.pool["A"]).count() == 2


# --- the job page's cost card ------------------------------------------------------------------


def _render_cost(job, user) -> str:
    return Template("{% load billing_tags %}{% job_cost job user %}").render(
        Context({"job": job, "user": user})
    )


def test_job_cost_card_for_members_and_involved_admins_only(world):
    job = world.jobs["J2"]  # project B on C's and A's pools
    JobSite.objects.create(job=job, site=world.site["C"], dataset_version=DatasetVersionFactory())
    member = UserFactory()
    ProjectMember.objects.create(project=job.project, user=member, role=ProjectRole.MEMBER)

    card = _render_cost(job, member)
    assert "Total charged to Institution B" in card
    assert "1.63 EUR" in card and "48.5000 SU" in card  # 1.60 + 0.03; 48 + 0.5 SU
    assert "Institution C" in card and "Institution A" in card
    assert "job-cost" in _render_cost(job, world.admins["C"])  # a JobSite of the job is at C
    assert "job-cost" in _render_cost(job, world.admins["B"])  # the project's institution
    assert _render_cost(job, UserFactory()).strip() == ""
    outsider = UserFactory()
    Membership.objects.create(user=outsider, institution=world.inst["C"], role=Role.RESEARCHER)
    assert _render_cost(job, outsider).strip() == ""


def test_job_page_shows_the_cost_card(client, world):
    job = world.jobs["J1"]
    member = UserFactory()
    ProjectMember.objects.create(project=job.project, user=member, role=ProjectRole.MEMBER)
    client.force_login(member)

    response = client.get(reverse("federation:job_detail", args=[job.pk]))

    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="job-cost"' in page
    assert "own pool — not charged" in page and "0.96 EUR" in page


def test_job_cost_card_before_billing(world):
    job = world.job("A", dt.date(2025, 3, 10), {})
    member = UserFactory()
    ProjectMember.objects.create(project=job.project, user=member, role=ProjectRole.MEMBER)
    assert "Not billed yet" in _render_cost(job, member)
    billing.job_bill(job=job)  # no usage: nothing to bill
    assert "Not billed yet" in _render_cost(job, member)

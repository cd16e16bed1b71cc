"""Energy and emissions on invoices (issue 15 point 5): each compute line carries its usage's kWh
and gCO2e, the invoice sums what the institution's jobs used (charges) and what its pools did for
others (credits), on the page and in the CSV. Figures are set and summed by hand."""

from __future__ import annotations

import csv
import datetime as dt
import io

import pytest
from django.urls import reverse

from accounting.models import BillingEntry, Invoice, UsageRecord
from accounting.selectors.billing import invoice_footprint
from accounting.services import billing
from portal.models import Membership, Role
from tests.accounting.test_billing import MARCH, ThreePools
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

#: (job, site) → (kWh, gCO2e) set on the usage records by hand.
FIGURES = {
    ("J1", "A"): (0.5, 100.0),
    ("J1", "B"): (1.25, 250.0),
    ("J2", "C"): (2.0, 600.0),
    ("J2", "A"): (0.25, 50.0),
}


@pytest.fixture
def world():
    w = ThreePools()
    w.jobs = {
        "J1": w.job("A", dt.date(2025, 3, 10), {"A": (2, 4, 0, 3600), "B": (4, 8, 1, 5400)}),
        "J2": w.job("B", dt.date(2025, 3, 20), {"C": (8, 16, 0, 7200), "A": (1, 2, 0, 1200)}),
        "J3": w.job("C", dt.date(2025, 3, 31), {"B": (2, 4, 0, 10000)}),  # no energy figures
    }
    for (job, site), (kwh, grams) in FIGURES.items():
        UsageRecord.objects.filter(job=w.jobs[job], site=w.site[site]).update(
            energy_kwh=kwh, emissions_g=grams
        )
    for job in w.jobs.values():
        billing.job_bill(job=job)
    return w


def test_compute_lines_carry_their_usages_energy_and_emissions(world):
    got = {
        (e.job.title, e.site.slug, e.kind): (e.energy_kwh, e.emissions_g)
        for e in BillingEntry.objects.select_related("job", "site")
    }
    j1, j2, j3 = (world.jobs[k].title for k in ("J1", "J2", "J3"))
    assert got == {
        (j1, "site-a", "compute_charge"): (0.5, 100.0),  # own pool: show-back line only
        (j1, "site-b", "compute_charge"): (1.25, 250.0),
        (j1, "site-b", "compute_credit"): (1.25, 250.0),
        (j2, "site-c", "compute_charge"): (2.0, 600.0),
        (j2, "site-c", "compute_credit"): (2.0, 600.0),
        (j2, "site-a", "compute_charge"): (0.25, 50.0),
        (j2, "site-a", "compute_credit"): (0.25, 50.0),
        (j3, "site-b", "compute_charge"): (None, None),
        (j3, "site-b", "compute_credit"): (None, None),
    }


def test_invoice_footprint_sums_charges_and_credits_by_hand(world):
    a = Invoice.objects.get(institution=world.inst["A"], month=MARCH)
    b = Invoice.objects.get(institution=world.inst["B"], month=MARCH)
    # A's jobs: J1@A 0.5 + J1@B 1.25 = 1.75 kWh, 100 + 250 = 350 g; A's pool for B: J2@A.
    assert invoice_footprint(invoice=a) == {
        "used": {"energy_kwh": 1.75, "emissions_g": 350.0, "lines": 2, "unmeasured": 0},
        "provided": {"energy_kwh": 0.25, "emissions_g": 50.0, "lines": 1, "unmeasured": 0},
    }
    # B's job J2: 2.0 + 0.25 = 2.25 kWh, 650 g; B's pool: J1@B 1.25 kWh 250 g, J3@B unmeasured.
    assert invoice_footprint(invoice=b) == {
        "used": {"energy_kwh": 2.25, "emissions_g": 650.0, "lines": 2, "unmeasured": 0},
        "provided": {"energy_kwh": 1.25, "emissions_g": 250.0, "lines": 2, "unmeasured": 1},
    }


def test_invoice_page_and_csv_show_energy_and_emissions(client, world):
    admin = UserFactory()
    Membership.objects.create(user=admin, institution=world.inst["A"], role=Role.INSTITUTION_ADMIN)
    client.force_login(admin)
    invoice = Invoice.objects.get(institution=world.inst["A"], month=MARCH)

    page = client.get(reverse("accounting:invoice_detail", args=[invoice.pk])).content.decode()
    assert 'id="footprint"' in page
    assert "1.750 kWh" in page and "350 gCO2e" in page  # used by A's jobs
    assert "0.250 kWh" in page and "50 gCO2e" in page  # provided by A's pool

    body = b"".join(
        client.get(reverse("accounting:invoice_csv", args=[invoice.pk])).streaming_content
    )
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    by_line = {(r["site"], r["kind"]): (r["energy_kwh"], r["emissions_g"]) for r in rows}
    assert by_line[("site-b", "compute_charge")] == ("1.25", "250.0")
    assert by_line[("site-a", "compute_credit")] == ("0.25", "50.0")

"""Billing services: a month on three institutions' pools billed and invoiced by hand, idempotency
of ``job_bill`` and ``invoice_close``, half-up rounding, the exact data-credit split, late entries,
price-rule validation. Expected values are computed by hand in the comments, not by the code."""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal

import pytest
from django.utils import timezone

from accounting.models import BillingEntry, Invoice, InvoiceStatus, PriceRule
from accounting.services import billing
from accounting.services.steps import job_accounting_chain
from accounting.tasks import invoice_close_task
from federation.models import JobStatus
from portal.ledger.models import LedgerEntry
from portal.models import AuditEvent
from tests.factories import (
    BillingJobFactory,
    BillingShareFactory,
    BillingUsageFactory,
    InstitutionFactory,
    PriceRuleFactory,
    ProjectFactory,
    SiteFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

D = Decimal
MARCH = dt.date(2025, 3, 1)
APRIL = dt.date(2025, 4, 1)
MAY = dt.date(2025, 5, 1)


def _at(day: dt.date, hour: int = 12) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, hour, tzinfo=dt.UTC)


class ThreePools:
    """Institutions A, B, C, each with one pool, one site and one project.

    Price rules (from 2025-01-01), SU per core-hour / GiB-hour / GPU-hour, price per SU (EUR):
      A: 1   / 0.25 / 0   at 0.05
      B: 1.5 / 0    / 10  at 0.04
      C: 2   / 0.5  / 0   at 0.0333
    """

    def __init__(self):
        self.inst, self.site, self.pool, self.project, self.rule = {}, {}, {}, {}, {}
        weights = {
            "A": ("1", "0.25", "0", "0.05"),
            "B": ("1.5", "0", "10", "0.04"),
            "C": ("2", "0.5", "0", "0.0333"),
        }
        for name, (cpu, mem, gpu, price) in weights.items():
            inst = InstitutionFactory(slug=f"inst-{name.lower()}", name=f"Institution {name}")
            self.inst[name] = inst
            self.site[name] = SiteFactory(
                institution=inst, slug=f"site-{name.lower()}", pool__name=f"pool-{name.lower()}"
            )
            self.pool[name] = pool = self.site[name].pools.get()
            self.project[name] = ProjectFactory(institution=inst, title=f"Project of {name}")
            self.rule[name] = PriceRuleFactory(
                pool=pool,
                effective_from=dt.date(2025, 1, 1),
                cpu_weight=D(cpu),
                memory_weight=D(mem),
                gpu_weight=D(gpu),
                price_per_unit=D(price),
            )

    def job(self, project: str, finished: dt.date, usage: dict, **kw):
        """A completed job of ``project`` with one usage record per site name in ``usage``
        (values: cores, memory GiB, GPUs, wall seconds)."""
        job = BillingJobFactory(project=self.project[project], finished_at=_at(finished), **kw)
        for site, (cores, mem, gpus, wall) in usage.items():
            BillingUsageFactory(
                job=job,
                site=self.site[site],
                cores=cores,
                memory_gib=D(mem),
                gpus=gpus,
                wall_seconds=wall,
                cpu_seconds=wall * cores * 0.4,  # measured CPU time is NOT billed
            )
        return job


@pytest.fixture
def world():
    return ThreePools()


def _entries(job):
    return {
        (e.site.slug, e.kind): (e.institution.slug, e.service_units, e.amount)
        for e in BillingEntry.objects.filter(job=job).select_related("site", "institution")
    }


def _invoice_state():
    return sorted(
        Invoice.objects.values_list(
            "institution__slug", "month", "status", "charges", "credits", "total", "closed_at"
        )
    )


def _bill_month(w: ThreePools):
    """The month of the issue's test: March 2025, jobs on all three pools (and one in April)."""
    jobs = {
        # J1, project A on A's and B's pools.
        #  @A: (1×2 cores + 0.25×4 GiB) × 1 h = 3 SU; own pool → charge 0.00, no credit.
        #  @B: (1.5×4 + 0×8 + 10×1 GPU) × 1.5 h = 16 × 1.5 = 24 SU × 0.04 = 0.96 → A pays B.
        "J1": w.job("A", dt.date(2025, 3, 10), {"A": (2, 4, 0, 3600), "B": (4, 8, 1, 5400)}),
        # J2, project B on C's and A's pools.
        #  @C: (2×8 + 0.5×16) × 2 h = 24 × 2 = 48 SU × 0.0333 = 1.5984 → 1.60 → B pays C.
        #  @A: (1×1 + 0.25×2) × (1200/3600) h = 1.5/3 = 0.5 SU × 0.05 = 0.025 → 0.03
        #      (ROUND_HALF_UP; banker's rounding would give 0.02) → B pays A.
        "J2": w.job("B", dt.date(2025, 3, 20), {"C": (8, 16, 0, 7200), "A": (1, 2, 0, 1200)}),
        # J3, project C on B's pool, finishing on the month's last day (23:00 UTC).
        #  @B: (1.5×2) × 10000/3600 h = 30000/3600 = 8.3333… → 8.3333 SU × 0.04 = 0.333332
        #      → 0.33 → C pays B.
        "J3": w.job("C", dt.date(2025, 3, 31), {"B": (2, 4, 0, 10000)}),
        # J4, project A on C's pool in April: (2×1 + 0.5×0) × 1 h = 2 SU × 0.0333 = 0.0666 → 0.07.
        "J4": w.job("A", dt.date(2025, 4, 2), {"C": (1, 0, 0, 3600)}),
    }
    for job in jobs.values():
        billing.job_bill(job=job)
    return jobs


def test_month_on_three_pools_gives_invoices_computed_by_hand(world):
    jobs = _bill_month(world)

    assert _entries(jobs["J1"]) == {
        ("site-a", "compute_charge"): ("inst-a", D("3.0000"), D("0.00")),
        ("site-b", "compute_charge"): ("inst-a", D("24.0000"), D("0.96")),
        ("site-b", "compute_credit"): ("inst-b", D("24.0000"), D("0.96")),
    }
    assert _entries(jobs["J2"]) == {
        ("site-a", "compute_charge"): ("inst-b", D("0.5000"), D("0.03")),
        ("site-a", "compute_credit"): ("inst-a", D("0.5000"), D("0.03")),
        ("site-c", "compute_charge"): ("inst-b", D("48.0000"), D("1.60")),
        ("site-c", "compute_credit"): ("inst-c", D("48.0000"), D("1.60")),
    }
    assert _entries(jobs["J3"]) == {
        ("site-b", "compute_charge"): ("inst-c", D("8.3333"), D("0.33")),
        ("site-b", "compute_credit"): ("inst-b", D("8.3333"), D("0.33")),
    }

    # March 2025, by hand:
    #   A: charges 0.96 (J1@B) + 0.00 (J1@A, own) = 0.96; credits 0.03 (J2@A); net 0.93
    #   B: charges 1.60 (J2@C) + 0.03 (J2@A) = 1.63; credits 0.96 (J1@B) + 0.33 (J3@B) = 1.29;
    #      net 0.34
    #   C: charges 0.33 (J3@B); credits 1.60 (J2@C); net −1.27
    #   (the federation nets to zero: 0.93 + 0.34 − 1.27 = 0)
    # April 2025: A charges 0.07 (J4@C); C credits 0.07.
    expected = {
        ("inst-a", MARCH): (D("0.96"), D("0.03"), D("0.93")),
        ("inst-b", MARCH): (D("1.63"), D("1.29"), D("0.34")),
        ("inst-c", MARCH): (D("0.33"), D("1.60"), D("-1.27")),
        ("inst-a", APRIL): (D("0.07"), D("0.00"), D("0.07")),
        ("inst-c", APRIL): (D("0.00"), D("0.07"), D("-0.07")),
    }

    def invoices():
        return {
            (i.institution.slug, i.month): (i.charges, i.credits, i.total)
            for i in Invoice.objects.select_related("institution")
        }

    assert invoices() == expected  # the running totals of the open invoices
    assert all(i.status == InvoiceStatus.OPEN for i in Invoice.objects.all())

    closed = billing.invoice_close(month=dt.date(2025, 4, 20))  # closes months before April

    assert {(i.institution.slug, i.month) for i in closed} == {
        ("inst-a", MARCH),
        ("inst-b", MARCH),
        ("inst-c", MARCH),
    }
    assert invoices() == expected  # recomputed from the entries: the same
    march = Invoice.objects.filter(month=MARCH)
    assert {i.status for i in march} == {InvoiceStatus.CLOSED}
    assert all(i.closed_at is not None for i in march)
    assert Invoice.objects.get(institution=world.inst["A"], month=APRIL).status == "open"
    assert AuditEvent.objects.filter(action="invoice.close").count() == 3

    before = _invoice_state()
    assert billing.invoice_close(month=dt.date(2025, 4, 20)) == []  # closing twice
    assert _invoice_state() == before
    assert AuditEvent.objects.filter(action="invoice.close").count() == 3

    assert len(billing.invoice_close()) == 2  # default: every month before the current one
    assert billing.invoice_close() == []
    assert set(Invoice.objects.values_list("status", flat=True)) == {InvoiceStatus.CLOSED}


def test_job_bill_twice_changes_nothing(world):
    jobs = _bill_month(world)
    entries = sorted(BillingEntry.objects.values_list())
    invoices = _invoice_state()
    leaves = LedgerEntry.objects.count()

    for job in jobs.values():
        assert billing.job_bill(job=job) == []

    assert sorted(BillingEntry.objects.values_list()) == entries
    assert _invoice_state() == invoices
    assert LedgerEntry.objects.count() == leaves
    assert AuditEvent.objects.filter(action="job.bill").count() == 4  # J1–J4, once each


def test_job_bill_appends_each_entry_to_the_ledger(world):
    job = world.job("A", dt.date(2025, 3, 10), {"B": (4, 8, 1, 5400)})

    created = billing.job_bill(job=job)

    leaves = list(LedgerEntry.objects.order_by("index"))
    assert [leaf.kind for leaf in leaves] == ["charge", "credit"]
    charge = json.loads(leaves[0].data)
    entry = BillingEntry.objects.get(job=job, kind="compute_charge")
    assert charge == {
        "kind": "charge",
        "entry": entry.pk,
        "job": job.pk,
        "site": "site-b",
        "billing_kind": "compute_charge",
        "run": 1,
        "institution": "inst-a",
        "price_rule": world.rule["B"].pk,
        "service_units": "24.0000",
        "amount": "0.96",
        "currency": "EUR",
        "invoice": entry.invoice_id,
        "month": "2025-03-01",
        # One time-of-use piece (pool B has no bands): the 1.5 h held up to the 12:00 finish.
        "priced": [["2025-03-10T10:30:00+00:00", "2025-03-10T12:00:00+00:00", "24.0000", "0.0400"]],
    }
    assert json.loads(leaves[1].data)["institution"] == "inst-b"
    assert {e.pk for e in created} == set(BillingEntry.objects.values_list("pk", flat=True))


def test_price_rule_picked_by_finish_day(world):
    pool_b = world.pool["B"]
    # From 2025-03-15 pool B costs 0.10 per SU; a job finishing on the 14th keeps 0.04.
    PriceRuleFactory(pool=pool_b, effective_from=dt.date(2025, 3, 15), cpu_weight=D("1.5"),
                     gpu_weight=D("10"), price_per_unit=D("0.10"))  # fmt: skip
    before = world.job("A", dt.date(2025, 3, 14), {"B": (4, 8, 1, 5400)})
    after = world.job("A", dt.date(2025, 3, 15), {"B": (4, 8, 1, 5400)})

    billing.job_bill(job=before)
    billing.job_bill(job=after)

    # 24 SU × 0.04 = 0.96 and 24 SU × 0.10 = 2.40
    assert _entries(before)[("site-b", "compute_charge")][2] == D("0.96")
    assert _entries(after)[("site-b", "compute_charge")][2] == D("2.40")


def test_pool_without_a_price_rule_is_not_billed(world):
    PriceRule.objects.filter(pool=world.pool["C"]).delete()
    job = world.job("A", dt.date(2025, 3, 10), {"C": (8, 16, 0, 7200)})

    assert billing.job_bill(job=job) == []
    assert not Invoice.objects.exists()


def test_completed_job_without_finish_time_is_refused(world):
    job = world.job("A", dt.date(2025, 3, 10), {"B": (1, 1, 0, 60)})
    job.finished_at = None
    job.save(update_fields=["finished_at"])

    with pytest.raises(billing.BillingError, match="no finish time"):
        billing.job_bill(job=job)
    assert not BillingEntry.objects.exists()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (D("0.025"), D("0.03")),  # half-up, not half-even (0.02)
        (D("0.015"), D("0.02")),
        (D("1.5984"), D("1.60")),
        (D("0.333332"), D("0.33")),
        (D("0.004999"), D("0.00")),
        (D("2.675"), D("2.68")),  # float 2.675 would round to 2.67
    ],
)
def test_money_rounds_half_up_to_cents(value, expected):
    assert billing.money(value) == expected


def test_service_units_bill_reserved_cores_times_wall_hours(world):
    # (1.5×2 + 0×4 + 10×0) × 10000 s / 3600 = 8.3333… → 8.3333; cpu_seconds do not matter.
    usage = BillingUsageFactory.build(
        cores=2, memory_gib=D("4"), gpus=0, wall_seconds=10000.0, cpu_seconds=1.0
    )
    assert billing.service_units(usage=usage, rule=world.rule["B"]) == D("8.3333")
    # (1×3 + 0.25×1.5) × 0.1 s / 3600 = 3.375 × 0.1 / 3600 = 0.00009375 → 0.0001 (half-up)
    usage = BillingUsageFactory.build(cores=3, memory_gib=D("1.5"), wall_seconds=0.1)
    assert billing.service_units(usage=usage, rule=world.rule["A"]) == D("0.0001")


def test_service_units_bill_the_held_slot_when_recorded(world):
    # The slot was held 7200 s while the ClientApp worked 10 s: (1.5×2) × 7200 / 3600 = 6.
    usage = BillingUsageFactory.build(
        cores=2, memory_gib=D("4"), wall_seconds=10.0, reserved_seconds=7200.0
    )
    assert billing.service_units(usage=usage, rule=world.rule["B"]) == D("6.0000")


# --- data credits ------------------------------------------------------------------------------


def _data_world(w: ThreePools, *, rate: str = "0.10"):
    """Project A's job computing on a priced pool of B with a data credit rate, data at the
    sites data-a (A), data-b (B) and data-c (C)."""
    compute = SiteFactory(institution=w.inst["B"], slug="data-b", pool__name="pool-b-data")
    PriceRuleFactory(pool=compute.pools.get(), effective_from=dt.date(2025, 1, 1), cpu_weight=D("1"),
                     price_per_unit=D("0.10"), data_credit_rate=D(rate))  # fmt: skip
    others = [SiteFactory(institution=w.inst[n], slug=f"data-{n.lower()}") for n in ("A", "C")]
    job = BillingJobFactory(project=w.project["A"], finished_at=_at(dt.date(2025, 3, 5)))
    # 10 cores × 10 h = 100 SU × 0.10 = 10.00; data: 0.10 × 10.00 = 1.00
    BillingUsageFactory(job=job, site=compute, cores=10, memory_gib=D("0"), wall_seconds=36000)
    return job, {"data-b": compute, "data-a": others[0], "data-c": others[1]}


def test_data_credit_split_sums_exactly(world):
    job, sites = _data_world(world)
    for site in sites.values():
        BillingShareFactory(job=job, site=site, method="exact", share=1 / 3)

    billing.job_bill(job=job)

    # 1.00 / 3 = 0.333… each → 0.33 each, 0.01 left over; equal remainders → the first slug
    # (data-a) gets it: 0.34 + 0.33 + 0.33 = 1.00.
    entries = _entries(job)
    assert entries[("data-b", "data_charge")] == ("inst-a", D("0"), D("1.00"))
    assert entries[("data-a", "data_credit")] == ("inst-a", D("0"), D("0.34"))
    assert entries[("data-b", "data_credit")] == ("inst-b", D("0"), D("0.33"))
    assert entries[("data-c", "data_credit")] == ("inst-c", D("0"), D("0.33"))
    assert entries[("data-b", "compute_charge")][2] == D("10.00")
    # A: charges 10.00 + 1.00 = 11.00, credits 0.34, net 10.66; B: credits 10.00 + 0.33;
    # C: credits 0.33. 10.66 − 10.33 − 0.33 = 0.
    totals = dict(Invoice.objects.values_list("institution__slug", "total"))
    assert totals == {"inst-a": D("10.66"), "inst-b": D("-10.33"), "inst-c": D("-0.33")}
    assert sum(totals.values()) == 0


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.STOPPED])
def test_failed_job_is_billed_for_the_compute_it_used_and_earns_no_data_credit(world, status):
    job, sites = _data_world(world)
    job.status = status
    job.save(update_fields=["status"])
    for site in sites.values():  # scores exist (e.g. from an earlier step): still no data lines
        BillingShareFactory(job=job, site=site, method="exact", share=1 / 3)
    running = BillingJobFactory(project=world.project["A"], status=JobStatus.RUNNING)

    billing.job_bill(job=job)
    billing.job_bill(job=running)

    # The slot time it held until it ended: 10 cores × 10 h = 100 SU × 0.10 = 10.00, as for a
    # completed job (Slurm: allocated TRES × elapsed, whatever the exit code); no data charge
    # and no data credit.
    assert _entries(job) == {
        ("data-b", "compute_charge"): ("inst-a", D("100.0000"), D("10.00")),
        ("data-b", "compute_credit"): ("inst-b", D("100.0000"), D("10.00")),
    }
    assert _entries(running) == {}


def test_data_credit_prefers_exact_then_gtg_then_data_volume(world):
    job, sites = _data_world(world)
    # data volume would give everything to data-c, GTG everything to data-b
    BillingShareFactory(job=job, site=sites["data-c"], method="data_volume", share=1.0)
    BillingShareFactory(job=job, site=sites["data-b"], method="gtg", share=1.0)
    BillingShareFactory(job=job, site=sites["data-c"], method="gtg", share=0.0)

    billing.job_bill(job=job)

    credits = {k[0]: v[2] for k, v in _entries(job).items() if k[1] == "data_credit"}
    assert credits == {"data-b": D("1.00"), "data-c": D("0.00")}


def test_data_credits_wait_for_scores_and_are_written_once(world):
    job, sites = _data_world(world)

    billing.job_bill(job=job)  # no contribution scores yet: compute only
    assert {k[1] for k in _entries(job)} == {"compute_charge", "compute_credit"}

    BillingShareFactory(job=job, site=sites["data-a"], method="data_volume", share=0.25)
    BillingShareFactory(job=job, site=sites["data-b"], method="data_volume", share=0.75)
    created = billing.job_bill(job=job)
    # 1.00 × 0.25 = 0.25, 1.00 × 0.75 = 0.75
    assert sorted((e.kind, e.site.slug, e.amount) for e in created) == [
        ("data_charge", "data-b", D("1.00")),
        ("data_credit", "data-a", D("0.25")),
        ("data_credit", "data-b", D("0.75")),
    ]
    # exact scores arriving later do not add or change data entries
    BillingShareFactory(job=job, site=sites["data-c"], method="exact", share=1.0)
    assert billing.job_bill(job=job) == []


@pytest.mark.parametrize(
    ("total", "shares", "expected"),
    [
        # 0.07 × (0.5, 0.3, 0.2) = 0.035, 0.021, 0.014 → 0.03, 0.02, 0.01 (sum 0.06); the cent
        # left goes to the largest remainder (0.005 of "a"): 0.04, 0.02, 0.01.
        ("0.07", {"a": "0.5", "b": "0.3", "c": "0.2"}, {"a": "0.04", "b": "0.02", "c": "0.01"}),
        # 1.00 × 2/3, 1/3 with unnormalised shares 2 and 1: 0.666…, 0.333… → 0.66, 0.33;
        # the cent goes to "x" (remainder 0.00666… > 0.00333…): 0.67, 0.33.
        ("1.00", {"x": "2", "y": "1"}, {"x": "0.67", "y": "0.33"}),
        # a negative share counts as 0
        ("5.00", {"p": "1", "q": "-0.2"}, {"p": "5.00", "q": "0.00"}),
    ],
)
def test_split_exact_by_hand(total, shares, expected):
    parts = billing.split_exact(D(total), {k: D(v) for k, v in shares.items()})
    assert parts == {k: D(v) for k, v in expected.items()}


def test_split_exact_always_sums_to_the_total():
    rng = random.Random(20251)
    for _ in range(300):
        total = D(rng.randint(0, 10**6)) / 100
        shares = {f"s{i:02d}": D(repr(rng.random())) for i in range(rng.randint(1, 12))}
        parts = billing.split_exact(total, shares)
        assert sum(parts.values()) == total
        whole = sum(shares.values())
        for k, part in parts.items():
            assert abs(part - total * shares[k] / whole) < D("0.01")
            assert part == part.quantize(D("0.01"))


def test_split_exact_refuses_shares_without_a_positive_sum():
    with pytest.raises(ValueError, match="positive sum"):
        billing.split_exact(D("1.00"), {"a": D("0"), "b": D("-1")})


# --- invoices ----------------------------------------------------------------------------------


def test_late_entry_for_a_closed_month_goes_to_the_next_open_month(world):
    j1 = world.job("A", dt.date(2025, 3, 10), {"B": (4, 8, 1, 5400)})
    billing.job_bill(job=j1)
    billing.invoice_close(month=APRIL)  # March closed; 0.96 / 0.96
    closed = _invoice_state()
    late = world.job("A", dt.date(2025, 3, 28), {"B": (2, 4, 0, 10000)})  # 8.3333 SU → 0.33

    billing.job_bill(job=late)

    assert [i for i in _invoice_state() if i[1] == MARCH] == closed  # March untouched
    entry = BillingEntry.objects.get(job=late, kind="compute_charge")
    assert entry.invoice.month == APRIL and entry.invoice.status == "open"
    assert entry.invoice.charges == D("0.33")

    billing.invoice_close(month=MAY)  # April closed too: the next late entry goes to May
    later = world.job("A", dt.date(2025, 3, 29), {"B": (2, 4, 0, 10000)})
    billing.job_bill(job=later)
    assert BillingEntry.objects.get(job=later, kind="compute_credit").invoice.month == MAY


def test_invoice_close_refuses_a_month_after_the_current_one():
    next_month = billing.next_month(billing.month_start(timezone.localdate()))
    with pytest.raises(ValueError, match="cannot close"):
        billing.invoice_close(month=next_month)


def test_next_month_crosses_the_year():
    assert billing.next_month(dt.date(2025, 12, 1)) == dt.date(2026, 1, 1)
    assert billing.next_month(dt.date(2024, 1, 31)) == dt.date(2024, 2, 1)


def test_tasks_close_invoices_and_bill_jobs_idempotently(world, eager_celery):
    job = world.job("B", dt.date(2025, 3, 20), {"C": (8, 16, 0, 7200)})

    job_accounting_chain(job.pk).delay()  # the steps' chain: usage, contribution, billing, credit
    assert BillingEntry.objects.filter(job=job).count() == 2
    job_accounting_chain(job.pk).delay()
    assert BillingEntry.objects.filter(job=job).count() == 2
    assert invoice_close_task.delay().get() == 2
    assert invoice_close_task.delay().get() == 0
    assert invoice_close_task.name == "accounting.invoice_close"


# --- price rules -------------------------------------------------------------------------------


def _rule_kwargs(**overrides):
    kwargs = dict(
        effective_from=timezone.localdate() + dt.timedelta(days=1),
        cpu_weight=D("1"),
        memory_weight=D("0.25"),
        gpu_weight=D("8"),
        price_per_unit=D("0.045"),
        currency="EUR",
        data_credit_rate=D("0.05"),
    )
    return kwargs | overrides


def test_price_rule_create_adds_history_and_audits(world):
    admin = UserFactory()
    pool = world.pool["A"]

    rule = billing.price_rule_create(by=admin, pool=pool, **_rule_kwargs())

    assert list(pool.price_rules.order_by("effective_from")) == [world.rule["A"], rule]
    event = AuditEvent.objects.get(action="price_rule.create")
    assert event.actor == admin and event.institution == world.inst["A"]
    assert event.data["price_per_unit"] == "0.045"


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"effective_from": dt.date(2024, 1, 1)}, "effective_from", "retroactively"),
        ({"price_per_unit": D("-1")}, "price_per_unit", "zero or more"),
        ({"gpu_weight": D("-0.5")}, "gpu_weight", "zero or more"),
        (
            {"cpu_weight": D(0), "memory_weight": D(0), "gpu_weight": D(0)},
            None,
            "At least one",
        ),
        ({"data_credit_rate": D("1.5")}, "data_credit_rate", "between 0 and 1"),
        ({"currency": "USD"}, "currency", "bills in EUR"),
    ],
)
def test_price_rule_create_refuses_bad_input(world, overrides, field, message):
    with pytest.raises(billing.BillingError) as exc:
        billing.price_rule_create(by=None, pool=world.pool["A"], **_rule_kwargs(**overrides))
    assert any(message in m for m in exc.value.field_errors[field])
    assert PriceRule.objects.count() == 3  # nothing written
    assert not AuditEvent.objects.filter(action="price_rule.create").exists()


def test_price_rule_create_refuses_a_second_rule_on_the_same_day(world):
    kwargs = _rule_kwargs()
    billing.price_rule_create(by=None, pool=world.pool["A"], **kwargs)
    with pytest.raises(billing.BillingError) as exc:
        billing.price_rule_create(by=None, pool=world.pool["A"], **kwargs)
    assert "already has a price rule" in exc.value.field_errors["effective_from"][0]


@pytest.mark.django_db(transaction=True)
def test_concurrent_job_bill_charges_once():
    """Two workers billing the same job at once (real PostgreSQL connections): the job row lock
    and the (job, site, kind) constraint leave one set of entries and one set of ledger leaves."""
    import threading

    from django.db import connection

    w = ThreePools()
    job = w.job("A", dt.date(2025, 3, 10), {"B": (4, 8, 1, 5400), "C": (8, 16, 0, 7200)})
    barrier = threading.Barrier(2)
    created, errors = [], []

    def worker():
        try:
            barrier.wait()
            created.append(len(billing.job_bill(job=job)))
        except Exception as exc:  # pragma: no cover — reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    assert sorted(created) == [0, 4]  # compute charge + credit at B and at C, once
    assert BillingEntry.objects.filter(job=job).count() == 4
    assert LedgerEntry.objects.count() == 4
    # A: 0.96 (B) + 48 SU at C (2×8 + 0.5×16) × 2 h × 0.0333 = 1.5984 → 1.60; total 2.56
    assert Invoice.objects.get(institution=w.inst["A"]).charges == D("2.56")

"""Accounting records: metered usage, contribution scores, prices and bills, credit.

Each section below belongs to one part of issue 5; the services of that part are the only writers:

* usage and contribution — ``accounting.services.usage`` / ``accounting.services.contribution``;
* prices, billing entries, invoices — ``accounting.services.billing``;
* credit statements (CRediT, ANSI/NISO Z39.104-2022) — ``accounting.services.credit``;
* the state of each accounting step of a finished job — ``accounting.services.steps``.

Each record is also a leaf of the core's ledger (``portal.ledger``).

Money is ``Decimal`` (``DecimalField``), never float.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils import timezone

# ---------------------------------------------------------------------------------------------
# Metering
# ---------------------------------------------------------------------------------------------


class UsageRecord(models.Model):
    """What one site spent on one run of one job, summed over rounds from the ClientApp's metering.

    ``run`` is the run's ordinal within the job (1 = its first Flower run; a job resumed from a
    round checkpoint runs again as run 2, 3, …, ADR 0028) and ``flower_run_id`` its Flower run id;
    ``ended_at`` is when that run ended (the job's ``finished_at`` then; it picks the price rule
    and the invoice month). A run's record holds the work done in that run only, so the records
    of a job sum to everything it spent, each piece of work once.

    ``cpu_seconds``/``wall_seconds``: process CPU time and elapsed time of the ClientApp's work;
    ``examples``: training plus evaluation examples used; ``bytes_received``/``bytes_sent``: model
    payload bytes the site received from / sent to the SuperLink. ``flower_*`` hold Flower's own
    per-run figures where the SuperLink reports them, for the cross-check.
    """

    job = models.ForeignKey(
        "federation.FederatedJob", on_delete=models.PROTECT, related_name="usage_records"
    )
    site = models.ForeignKey("portal.Site", on_delete=models.PROTECT, related_name="usage")
    run = models.PositiveIntegerField(
        default=1, help_text="The job's run this record meters: 1, then 2, … after each resume."
    )
    flower_run_id = models.CharField(max_length=32, blank=True, help_text="uint64, as text.")
    ended_at = models.DateTimeField(
        null=True, blank=True, help_text="When the run ended (null: the job's finish time)."
    )
    rounds = models.PositiveIntegerField(default=0)
    cpu_seconds = models.FloatField(default=0.0)
    wall_seconds = models.FloatField(default=0.0)
    reserved_seconds = models.FloatField(
        null=True,
        blank=True,
        help_text="Seconds the site's pool slot was held for the job (its start to its end).",
    )
    examples = models.PositiveBigIntegerField(default=0)
    bytes_received = models.PositiveBigIntegerField(default=0)
    bytes_sent = models.PositiveBigIntegerField(default=0)
    cores = models.PositiveIntegerField(default=1, help_text="Cores reserved for the ClientApp.")
    memory_gib = models.DecimalField(
        max_digits=8, decimal_places=3, default=Decimal("1"), help_text="Memory reserved, GiB."
    )
    gpus = models.PositiveIntegerField(default=0)
    flower_compute_seconds = models.FloatField(null=True, blank=True)
    flower_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    energy_kwh = models.FloatField(
        null=True,
        blank=True,
        help_text="(CPU seconds × the pool's W per core + reserved GPUs × held seconds × W per "
        "GPU) ÷ 3.6e6 (kWh).",
    )
    emissions_g = models.FloatField(
        null=True,
        blank=True,
        help_text="Energy × the grid's mean intensity during the run (gCO2e).",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "site__slug", "run"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "site", "run"], name="usage_unique_job_site_run"
            ),
        ]

    def __str__(self) -> str:
        return f"usage {self.job_id} run {self.run} @ {self.site_id}"


# ---------------------------------------------------------------------------------------------
# Contribution
# ---------------------------------------------------------------------------------------------


class ContributionMethod(models.TextChoices):
    EXACT = "exact", "Exact Shapley"
    GTG = "gtg", "GTG-Shapley"
    LOO = "loo", "Leave-one-out"
    DATA_VOLUME = "data_volume", "Data volume"


class ContributionScore(models.Model):
    """One site's contribution to one job by one method; ``round`` 0 is the whole run.

    ``raw_value``: the method's value in utility units (median held-out accuracy, ADR 0024), for
    data volume the site's exact training examples;
    ``share``: the normalised value (non-negative, shares of a job and method sum to 1), for data
    volume normalised from the released counts (ADR 0036), never from the exact examples;
    ``evaluations``: coalition utilities the method evaluated.
    """

    job = models.ForeignKey(
        "federation.FederatedJob", on_delete=models.PROTECT, related_name="contribution_scores"
    )
    site = models.ForeignKey(
        "portal.Site", on_delete=models.PROTECT, related_name="contribution_scores"
    )
    method = models.CharField(max_length=16, choices=ContributionMethod.choices)
    round = models.PositiveIntegerField(default=0, help_text="0 = the whole run.")
    raw_value = models.FloatField()
    share = models.FloatField()
    evaluations = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "method", "round", "site__slug"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "site", "method", "round"], name="contribution_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.method} {self.site_id}: {self.share:.3f}"


# ---------------------------------------------------------------------------------------------
# Prices and bills
# ---------------------------------------------------------------------------------------------


class PriceRule(models.Model):
    """A pool's price from ``effective_from``: Slurm TRESBillingWeights style.

    service units = cpu_weight × core-hours + memory_weight × GiB-hours + gpu_weight × GPU-hours;
    amount = service units × ``price_per_unit`` (in ``currency``). ``data_credit_rate`` is the
    share of a job's compute charges paid out to data providers by Shapley share (0 = none).
    """

    pool = models.ForeignKey(
        "federation.ComputePool", on_delete=models.CASCADE, related_name="price_rules"
    )
    effective_from = models.DateField()
    cpu_weight = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("1"))
    memory_weight = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    gpu_weight = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    price_per_unit = models.DecimalField(max_digits=12, decimal_places=4)
    currency = models.CharField(max_length=3, default="EUR")
    data_credit_rate = models.DecimalField(max_digits=5, decimal_places=4, default=Decimal("0"))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pool", "-effective_from"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "effective_from"], name="price_rule_unique"),
            models.CheckConstraint(
                condition=models.Q(cpu_weight__gte=0)
                & models.Q(memory_weight__gte=0)
                & models.Q(gpu_weight__gte=0)
                & models.Q(price_per_unit__gte=0),
                name="price_rule_non_negative",
            ),
            models.CheckConstraint(
                condition=models.Q(data_credit_rate__gte=0) & models.Q(data_credit_rate__lte=1),
                name="price_rule_data_credit_rate_0_1",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pool} from {self.effective_from}"


class InvoiceStatus(models.TextChoices):
    OPEN = "open", "Open"
    CLOSED = "closed", "Closed"


class Invoice(models.Model):
    """One institution's bill for one calendar month (``month`` is its first day)."""

    institution = models.ForeignKey(
        "portal.Institution", on_delete=models.PROTECT, related_name="invoices"
    )
    month = models.DateField(help_text="First day of the calendar month.")
    currency = models.CharField(max_length=3, default="EUR")
    status = models.CharField(
        max_length=8, choices=InvoiceStatus.choices, default=InvoiceStatus.OPEN
    )
    charges = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))
    credits = models.DecimalField(max_digits=14, decimal_places=2, default=Decimal("0"))
    total = models.DecimalField(
        max_digits=14, decimal_places=2, default=Decimal("0"), help_text="charges − credits."
    )
    closed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-month", "institution__name"]
        constraints = [
            models.UniqueConstraint(fields=["institution", "month"], name="invoice_unique_month"),
            models.CheckConstraint(
                condition=models.Q(charges__gte=0) & models.Q(credits__gte=0),
                name="invoice_sums_non_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.institution} {self.month:%Y-%m}"


class BillingKind(models.TextChoices):
    COMPUTE_CHARGE = "compute_charge", "Compute charge"
    COMPUTE_CREDIT = "compute_credit", "Compute credit"
    DATA_CHARGE = "data_charge", "Data charge"
    DATA_CREDIT = "data_credit", "Data credit"


class BillingEntry(models.Model):
    """One charge or credit for one site's part in one run of a job; unique per
    (job, site, kind, run).

    ``institution`` is who pays (charges) or is paid (credits); ``amount`` is positive in both
    cases; ``service_units`` is what the pool's price rule made of the usage. ``run`` is the
    job's run whose usage a compute line prices (ADR 0028: a resumed job's new run adds its own
    lines; lines already written are never changed); the data lines of a completed job carry its
    last run.
    """

    job = models.ForeignKey(
        "federation.FederatedJob", on_delete=models.PROTECT, related_name="billing_entries"
    )
    site = models.ForeignKey(
        "portal.Site", on_delete=models.PROTECT, related_name="billing_entries"
    )
    kind = models.CharField(max_length=16, choices=BillingKind.choices)
    run = models.PositiveIntegerField(default=1, help_text="The job's run (see UsageRecord.run).")
    institution = models.ForeignKey(
        "portal.Institution", on_delete=models.PROTECT, related_name="billing_entries"
    )
    price_rule = models.ForeignKey(PriceRule, null=True, on_delete=models.PROTECT)
    service_units = models.DecimalField(max_digits=14, decimal_places=4, default=Decimal("0"))
    amount = models.DecimalField(max_digits=14, decimal_places=2)
    price_detail = models.JSONField(
        default=list,
        blank=True,
        help_text="A compute line's pieces at one time-of-use price each: [{from, to (ISO 8601 "
        "UTC), seconds, service_units, price}] (Decimal strings); amount = money(Σ SU × price).",
    )
    energy_kwh = models.FloatField(
        null=True,
        blank=True,
        help_text="A compute line's energy: its usage record's kWh (null: not measured).",
    )
    emissions_g = models.FloatField(
        null=True,
        blank=True,
        help_text="A compute line's emissions: its usage record's gCO2e (null: not measured).",
    )
    currency = models.CharField(max_length=3, default="EUR")
    invoice = models.ForeignKey(
        Invoice,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="entries",
        db_index=False,  # the (invoice, job) index below serves lookups by invoice
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "site__slug", "kind", "run"]
        indexes = [
            # An invoice's lines in job order (its page, 50 at a time, and its CSV): without it
            # PostgreSQL walked every entry in job order to find the invoice's (issue 12).
            models.Index(fields=["invoice", "job"], name="billing_invoice_job"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "site", "kind", "run"], name="billing_unique_entry_run"
            ),
            models.CheckConstraint(condition=models.Q(amount__gte=0), name="billing_amount_gte_0"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount} {self.currency}"


# ---------------------------------------------------------------------------------------------
# Credit (CRediT)
# ---------------------------------------------------------------------------------------------


class CreditStatement(models.Model):
    """Who contributed what to one job, in CRediT roles (ANSI/NISO Z39.104-2022).

    Drafted from the job's data by ``accounting.services.credit.credit_statement_draft`` (which
    refreshes it while ``edited_at`` is empty); once a PI of the job's project edits it
    (``credit_statement_update``), ``edited_at``/``edited_by`` are set and drafting leaves it
    alone (``edited_at`` stays even if the editor's account is deleted later).
    """

    job = models.OneToOneField(
        "federation.FederatedJob", on_delete=models.PROTECT, related_name="credit_statement"
    )
    edited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    edited_at = models.DateTimeField(null=True, blank=True, help_text="Last edit by a PI.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"credit for job {self.job_id}"


class ContributorKind(models.TextChoices):
    PERSON = "person", "Person"
    INSTITUTION = "institution", "Institution"


class ShareMethod(models.TextChoices):
    """Where a contributor's share came from: a contribution method, or the PI."""

    NONE = "", "—"
    EXACT = "exact", "Exact Shapley"
    GTG = "gtg", "GTG-Shapley"
    DATA_VOLUME = "data_volume", "Data volume"
    PI = "pi", "Set by the PI"


class CreditContributor(models.Model):
    """One contributor line: a person or an institution, its CRediT roles and share.

    ``user``/``institution`` link the line to a portal account or institution when it has one
    (lines a PI adds by hand have neither); ``roles`` are role slugs in the standard's order;
    ``share`` is in [0, 1] or null (not measured), ``share_method`` says where it came from.
    """

    statement = models.ForeignKey(
        CreditStatement, on_delete=models.CASCADE, related_name="contributors"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT
    )
    institution = models.ForeignKey(
        "portal.Institution", null=True, blank=True, on_delete=models.PROTECT
    )
    kind = models.CharField(
        max_length=16, choices=ContributorKind.choices, default=ContributorKind.PERSON
    )
    name = models.CharField(max_length=200)
    roles = models.JSONField(default=list, help_text="CRediT role slugs, e.g. data-curation.")
    share = models.FloatField(null=True, blank=True, help_text="Contribution share, 0–1.")
    share_method = models.CharField(
        max_length=16, choices=ShareMethod.choices, blank=True, default=ShareMethod.NONE
    )
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["statement", "position", "id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(share__isnull=True)
                | (models.Q(share__gte=0) & models.Q(share__lte=1)),
                name="credit_share_0_1",
            ),
        ]

    def __str__(self) -> str:
        return self.name


# ---------------------------------------------------------------------------------------------
# Accounting steps of a finished job (ADR 0015)
# ---------------------------------------------------------------------------------------------


class AccountingStep(models.TextChoices):
    """The steps that account for a finished job, in the order they run."""

    USAGE = "usage", "Usage"
    CONTRIBUTION = "contribution", "Contribution"
    BILLING = "billing", "Billing"
    CREDIT = "credit", "Credit"


class StepStatus(models.TextChoices):
    """Where a step stands. ``pending`` runs (the chain, or the sweep when the chain was lost);
    ``failed``, ``partial`` and ``blocked`` wait for an admin's retry after the cause is mended."""

    PENDING = "pending", "Pending"
    DONE = "done", "Done"
    PARTIAL = "partial", "Done in part"
    BLOCKED = "blocked", "Blocked"
    FAILED = "failed", "Failed"


class JobAccountingStep(models.Model):
    """One accounting step of one finished job: its status, tries and, when it failed, why.

    ``attempts`` counts every run of the step (transient retries included); ``error`` is the
    readable reason of a ``failed`` step (or the last transient error of a ``pending`` one that
    is being retried); ``detail`` says what a finished step wrote, or what a ``partial`` or
    ``blocked`` one waits for. A job with fewer rows than steps has not been (fully) opened for
    accounting: the sweep opens it.
    """

    job = models.ForeignKey(
        "federation.FederatedJob", on_delete=models.CASCADE, related_name="accounting_steps"
    )
    step = models.CharField(max_length=16, choices=AccountingStep.choices)
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    detail = models.CharField(max_length=300, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "step"], name="accounting_step_unique"),
            models.CheckConstraint(
                condition=~models.Q(status="failed") | ~models.Q(error=""),
                name="accounting_step_failed_has_reason",
            ),
        ]
        indexes = [models.Index(fields=["status", "updated_at"], name="accounting_step_status")]

    def __str__(self) -> str:
        return f"job {self.job_id} {self.step}: {self.status}"

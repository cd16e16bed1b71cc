"""Compute pools, federated jobs, per-site participation, round metrics and the airlock.

Sites are the core's (``portal.models.Site``): a pool belongs to a site, a job runs at sites.
"""

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

WEEKDAYS = [
    (0, "Monday"),
    (1, "Tuesday"),
    (2, "Wednesday"),
    (3, "Thursday"),
    (4, "Friday"),
    (5, "Saturday"),
    (6, "Sunday"),
]


class ComputePool(models.Model):
    """Compute capacity of a site that runs SuperNode work, with a slot capacity.

    A pool belongs to one site (``site.pools``); a site may have several pools.
    """

    site = models.ForeignKey("portal.Site", on_delete=models.CASCADE, related_name="pools")
    name = models.CharField(max_length=100)
    slots = models.PositiveIntegerField(
        default=1, help_text="How many federated jobs may train here at the same time."
    )
    # Resources (what a job's per-site request is checked against).
    cores = models.PositiveIntegerField(default=8, help_text="CPU cores lent to federated jobs.")
    memory_gib = models.DecimalField(
        "memory (GiB)", max_digits=9, decimal_places=1, default=Decimal("32"), help_text="GiB."
    )
    gpus = models.PositiveIntegerField("GPUs", default=0)
    gpu_model = models.CharField(
        "GPU model",
        max_length=64,
        blank=True,
        help_text="e.g. NVIDIA A100 80GB; one model per pool.",
    )
    time_zone = models.CharField(
        max_length=64, default="UTC", help_text="IANA time zone of the windows and price bands."
    )
    always_available = models.BooleanField(
        default=True,
        help_text="Lent at all hours; otherwise only in the weekly windows below (and exceptions).",
    )
    # Price (service units per hour = cpu_weight·cores + memory_weight·GiB + gpu_weight·GPUs).
    base_price = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        default=Decimal("0"),
        help_text="Price per service unit·hour outside the time-of-use bands.",
    )
    currency = models.CharField(max_length=3, default="EUR")
    cpu_weight = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("1"))
    memory_weight = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    gpu_weight = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    demand_pricing = models.BooleanField(
        default=False,
        help_text="Raise the price of coming hours with the demand queued for them, within bounds.",
    )
    demand_elasticity = models.FloatField(
        default=0.5, validators=[MinValueValidator(0.0), MaxValueValidator(10.0)]
    )
    price_floor = models.FloatField(
        "lowest multiplier", default=1.0, validators=[MinValueValidator(0.0)]
    )
    price_cap = models.FloatField(
        "highest multiplier", default=2.0, validators=[MinValueValidator(0.0)]
    )
    # Carbon intensity and power draw.
    carbon_source = models.CharField(
        max_length=16,
        choices=[("constant", "Constant"), ("csv", "Uploaded CSV"), ("provider", "Provider API")],
        default="constant",
    )
    carbon_default = models.FloatField(
        "default intensity (gCO2e/kWh)",
        default=300.0,
        validators=[MinValueValidator(0.0)],
        help_text="Used where no reading covers an hour.",
    )
    carbon_provider = models.CharField(
        max_length=32,
        blank=True,
        choices=[("electricitymaps", "Electricity Maps"), ("watttime", "WattTime")],
    )
    carbon_zone = models.CharField(
        max_length=64,
        blank=True,
        help_text="The provider's zone or region code, e.g. DE, CAISO_NORTH.",
    )
    watts_per_core = models.FloatField(
        "W per core", default=10.0, validators=[MinValueValidator(0.0)]
    )
    watts_per_gpu = models.FloatField(
        "W per GPU", default=250.0, validators=[MinValueValidator(0.0)]
    )
    # Health from the SuperLink (``flwr supernode ls``).
    node_online = models.BooleanField(
        null=True, blank=True, help_text="Whether the site's SuperNode is online (None: unknown)."
    )
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # Capacity and health from the pool's adapter (``federation.pool_adapters``).
    adapter = models.CharField(
        max_length=16,
        choices=[("static", "Static (the figures on this page)"), ("slurm", "Slurm partition")],
        default="static",
        help_text="Where capacity and health come from: the figures on this page, or a Slurm "
        "partition read every few minutes (then the figures above are the most the pool lends).",
    )
    slurm_partition = models.CharField(
        max_length=64,
        blank=True,
        help_text="The Slurm partition whose nodes the pool lends, e.g. batch or gpu.",
    )
    slurm_conf = models.CharField(
        "slurm.conf path",
        max_length=255,
        blank=True,
        help_text="Absolute path of the cluster's slurm.conf on the portal's worker host "
        "(SLURM_CONF); empty: Slurm's default (/etc/slurm/slurm.conf).",
    )
    health = models.CharField(
        max_length=8,
        blank=True,
        choices=[("up", "Up"), ("drained", "Drained"), ("down", "Down")],
        help_text="Health from the last adapter read (empty: not read yet).",
    )
    health_reason = models.TextField(blank=True)
    read_at = models.DateTimeField(null=True, blank=True, help_text="Time of the last read.")
    reading = models.JSONField(
        default=dict,
        blank=True,
        help_text="Capacity of the last successful read: total and free cores, GiB, GPUs by "
        "model, nodes and nodes up (pool_adapters.Reading.to_json); empty after a failed read.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__institution__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["site", "name"], name="pool_unique_name"),
            models.CheckConstraint(condition=models.Q(slots__gte=1), name="pool_slots_gte_1"),
            models.CheckConstraint(
                condition=models.Q(base_price__gte=0)
                & models.Q(cpu_weight__gte=0)
                & models.Q(memory_weight__gte=0)
                & models.Q(gpu_weight__gte=0),
                name="pool_price_non_negative",
            ),
            models.CheckConstraint(
                condition=models.Q(price_floor__lte=models.F("price_cap")),
                name="pool_price_floor_le_cap",
            ),
            models.CheckConstraint(
                condition=~models.Q(adapter="slurm") | ~models.Q(slurm_partition=""),
                name="pool_slurm_needs_partition",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.site.institution.slug})"

    @property
    def institution(self):
        """The institution of the pool's site (which lends the pool and is paid for it)."""
        return self.site.institution


class AvailabilityWindow(models.Model):
    """A weekly span in which the pool is lent (in the pool's time zone); ``foreign_only``: only
    to projects of other institutions (idle capacity offered to the federation)."""

    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="windows")
    weekday = models.PositiveSmallIntegerField(choices=WEEKDAYS)
    start_minute = models.PositiveSmallIntegerField(validators=[MaxValueValidator(1439)])
    end_minute = models.PositiveSmallIntegerField(validators=[MaxValueValidator(1440)])
    foreign_only = models.BooleanField(
        default=False, help_text="Only for projects of other institutions."
    )

    class Meta:
        ordering = ["pool", "weekday", "start_minute"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(start_minute__lt=models.F("end_minute"))
                & models.Q(end_minute__lte=1440),
                name="window_start_before_end",
            )
        ]

    def __str__(self) -> str:
        return f"{self.get_weekday_display()} {self.start_minute // 60:02d}:{self.start_minute % 60:02d}–{self.end_minute // 60:02d}:{self.end_minute % 60:02d}"


class AvailabilityException(models.Model):
    """A dated exception to the weekly windows: the pool is open or closed in ``[start, end)``."""

    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="exceptions")
    start = models.DateTimeField()
    end = models.DateTimeField()
    available = models.BooleanField(default=False, help_text="Open (ticked) or closed.")
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["pool", "start"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(start__lt=models.F("end")), name="exception_start_before_end"
            )
        ]

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d %H:%M}–{self.end:%Y-%m-%d %H:%M} {'open' if self.available else 'closed'}"


class PriceBand(models.Model):
    """A time-of-use price: per service unit·hour during a weekly span (pool's time zone)."""

    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="price_bands")
    weekday = models.PositiveSmallIntegerField(choices=WEEKDAYS)
    start_minute = models.PositiveSmallIntegerField(validators=[MaxValueValidator(1439)])
    end_minute = models.PositiveSmallIntegerField(validators=[MaxValueValidator(1440)])
    price = models.DecimalField(max_digits=12, decimal_places=4)

    class Meta:
        ordering = ["pool", "weekday", "start_minute"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(start_minute__lt=models.F("end_minute"))
                & models.Q(end_minute__lte=1440)
                & models.Q(price__gte=0),
                name="price_band_valid",
            )
        ]

    def __str__(self) -> str:
        return (
            f"{self.get_weekday_display()} {self.start_minute}–{self.end_minute} min: {self.price}"
        )


class CarbonReading(models.Model):
    """Carbon intensity of the pool's grid from ``at`` (gCO2e/kWh), measured or forecast."""

    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="carbon_readings")
    at = models.DateTimeField()
    g_per_kwh = models.FloatField(validators=[MinValueValidator(0.0)])
    source = models.CharField(max_length=32, help_text="csv, or the provider's name.")
    forecast = models.BooleanField(default=False)

    class Meta:
        ordering = ["pool", "at"]
        constraints = [
            models.UniqueConstraint(fields=["pool", "at"], name="carbon_reading_unique"),
            models.CheckConstraint(
                condition=models.Q(g_per_kwh__gte=0), name="carbon_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pool_id} {self.at:%Y-%m-%d %H:%M} {self.g_per_kwh:g} g/kWh"


class PoolQuota(models.Model):
    """The most a project may hold on a pool at once."""

    pool = models.ForeignKey(ComputePool, on_delete=models.CASCADE, related_name="quotas")
    project = models.ForeignKey("portal.Project", on_delete=models.CASCADE, related_name="+")
    cores = models.PositiveIntegerField()
    memory_gib = models.DecimalField(max_digits=9, decimal_places=1, default=Decimal("1000000"))
    gpus = models.PositiveIntegerField(default=1000)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pool", "project"], name="pool_quota_unique")
        ]

    def __str__(self) -> str:
        return f"{self.project_id} on pool {self.pool_id}: {self.cores} cores"


class ProjectAllocation(models.Model):
    """A project's allocation for the scheduler: budget, fair-share shares and default QoS."""

    project = models.OneToOneField(
        "portal.Project", on_delete=models.CASCADE, related_name="allocation"
    )
    budget = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="Compute budget in the pools' currency (empty: unlimited).",
    )
    shares = models.PositiveIntegerField(
        default=1, help_text="Fair-share shares in its institution."
    )
    qos = models.CharField(
        "QoS", max_length=8, default="normal", choices=[(q, q) for q in ("low", "normal", "high")]
    )

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=models.Q(budget__isnull=True) | models.Q(budget__gte=0),
                name="allocation_budget_non_negative",
            )
        ]

    def __str__(self) -> str:
        return f"allocation of project {self.project_id}"


class SchedulePolicy(models.TextChoices):
    ASAP = "asap", "As soon as possible"
    CHEAPEST = "cheapest", "Cheapest before the deadline"
    GREENEST = "greenest", "Lowest carbon before the deadline"


class JobStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    LAUNCHING = "launching", "Launching"
    RUNNING = "running", "Running"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    STOPPED = "stopped", "Stopped"

    @classmethod
    def terminal(cls) -> set[str]:
        return {cls.COMPLETED, cls.FAILED, cls.STOPPED}

    @classmethod
    def active(cls) -> set[str]:
        return {cls.QUEUED, cls.LAUNCHING, cls.RUNNING}


class JobTask(models.TextChoices):
    CLASSIFICATION = "classification", "Classification"
    REGRESSION = "regression", "Regression"


def _new_callback_token() -> str:
    """Referenced by migration 0001 only (the callback token left the run config: ADR 0014)."""
    import secrets

    return secrets.token_hex(32)


class FederatedJob(models.Model):
    """A federated-learning job of a project, run as one Flower run on the SuperLink."""

    project = models.ForeignKey("portal.Project", on_delete=models.PROTECT, related_name="jobs")
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs"
    )
    title = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED)
    status_detail = models.TextField(blank=True, help_text="Readable reason for the status.")

    target_column = models.CharField(max_length=200)
    feature_columns = models.JSONField(default=list)
    task = models.CharField(
        max_length=16,
        choices=JobTask.choices,
        default=JobTask.CLASSIFICATION,
        help_text="Decided by the target's type (federation.columns).",
    )
    preprocessing = models.JSONField(
        default=list,
        blank=True,
        help_text="Per feature: kind, missing-value rule, indicator (frp_flwr.contract.FeaturePlan).",
    )
    preparation = models.JSONField(
        default=dict,
        blank=True,
        help_text="How the data were prepared, as the ServerApp reported it (contract.Preparation).",
    )
    model = models.CharField(max_length=32, default="logreg")
    strategy = models.CharField(max_length=32, default="fedavg")
    model_spec = models.JSONField(
        default=dict,
        blank=True,
        help_text="The model and its hyper-parameters (frp_flwr.models); empty: linear.",
    )
    strategy_spec = models.JSONField(
        default=dict,
        blank=True,
        help_text="The strategy and its parameters (frp_flwr.strategies); empty: FedAvg.",
    )
    num_rounds = models.PositiveIntegerField(default=5)
    local_epochs = models.PositiveIntegerField(default=5)
    learning_rate = models.FloatField(default=0.1)
    privacy = models.JSONField(
        default=dict,
        blank=True,
        help_text="Differential privacy settings (frp_flwr.contract.Privacy); empty: off.",
    )
    epsilon = models.FloatField(
        null=True,
        blank=True,
        help_text="ε the job spends at the privacy settings' δ (accountant, at submission).",
    )
    shapley_consent = models.BooleanField(
        null=True,
        blank=True,
        help_text="Whether the data steward of every dataset the job trains on had opted in to "
        "Shapley-value contribution when the job was last launched (sandbox.Dataset."
        "shapley_opt_in, ADR 0036): the run then sends coalition models to the sites; otherwise "
        "contribution is by data volume. Empty: not launched yet.",
    )
    secure_aggregation = models.BooleanField(
        default=False,
        help_text="SecAgg+ (frp_flwr.secagg): the ServerApp sees only the sum of the sites' "
        "updates, so contribution is measured by data volume and compute, not Shapley values.",
    )

    flower_run_id = models.CharField(max_length=32, blank=True, help_text="uint64, as text.")
    launch_nonce = models.CharField(
        max_length=32,
        blank=True,
        editable=False,
        help_text="Idempotency key of the current launch, recorded before the run is started and "
        "sent in its run config (not a secret), so a run already started is found, not repeated.",
    )
    superlink_lost_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="Since when the SuperLink has not answered while this job was active.",
    )
    callback_seq = models.PositiveBigIntegerField(
        default=0,
        editable=False,
        help_text="Sequence number of the last ServerApp event accepted (each is accepted once).",
    )
    final_metrics = models.JSONField(default=dict, blank=True)
    failure_reason = models.TextField(blank=True, help_text="Reason reported by the ServerApp.")
    model_key = models.CharField(
        max_length=200,
        blank=True,
        editable=False,
        help_text="Object key of the final model in the model store (federation.artifacts); the "
        "model itself is never in this row.",
    )
    resume_round = models.PositiveIntegerField(
        default=0,
        editable=False,
        help_text="The round checkpoint the current run resumed from (0: a fresh run).",
    )
    earlier_runs = models.JSONField(
        default=list,
        blank=True,
        editable=False,
        help_text="Flower run ids this job ran under before it was resumed (oldest first).",
    )

    # Scheduling request and the scheduler's latest word (``federation.admission``).
    policy = models.CharField(
        max_length=16, choices=SchedulePolicy.choices, default=SchedulePolicy.ASAP
    )
    deadline = models.DateTimeField(null=True, blank=True, help_text="Results wanted by.")
    budget_cap = models.DecimalField(
        max_digits=14, decimal_places=2, null=True, blank=True, help_text="The most it may cost."
    )
    qos = models.CharField("QoS", max_length=8, default="normal")
    preemptible = models.BooleanField(default=False)
    preempted_by = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
        help_text="The higher-QoS job this one was last preempted for (kept until it runs again).",
    )
    preempt_requested_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When the scheduler asked for this running job's Flower run to be stopped for "
        "a preemption; while set, the run's end queues the job again to resume (ADR 0035).",
    )
    estimated_seconds = models.FloatField(default=600.0, help_text="Estimated run time (s).")
    sched_reason = models.CharField(max_length=32, blank=True, help_text="Slurm-style reason code.")
    sched_priority = models.IntegerField(default=0)
    est_start = models.DateTimeField(null=True, blank=True)
    est_end = models.DateTimeField(null=True, blank=True)
    est_cost = models.DecimalField(max_digits=14, decimal_places=4, null=True, blank=True)
    est_energy_kwh = models.FloatField(null=True, blank=True)
    est_emissions_g = models.FloatField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        # The job lists read a page of the newest jobs: an index in that order (issue 12).
        indexes = [models.Index(fields=["-created_at", "-id"], name="job_newest_first")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(num_rounds__gte=1) & models.Q(num_rounds__lte=100),
                name="job_rounds_range",
            ),
            models.CheckConstraint(
                condition=models.Q(learning_rate__gt=0), name="job_learning_rate_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"

    @property
    def model_description(self) -> str:
        """The model and its hyper-parameters in one line (``federation.method.model_text``)."""
        from federation.method import model_text

        return model_text(self)

    @property
    def strategy_description(self) -> str:
        """The strategy and its parameters in one line (``federation.method.strategy_text``)."""
        from federation.method import strategy_text

        return strategy_text(self)

    @property
    def dp_description(self) -> str:
        """``"server-side fixed clipping"``, ``""`` without dp (``federation.method.dp_text``)."""
        from federation.method import dp_text

        return dp_text(self)

    @property
    def epsilon_description(self) -> str:
        """``"ε = 2.91 at δ = 1e-5"``, ``""`` without dp (``federation.method.epsilon_text``)."""
        from federation.method import delta, dp_on, epsilon_text

        return epsilon_text(self.epsilon, delta(self)) if dp_on(self) else ""

    @property
    def contribution_reconstruction(self) -> str:
        """How the contribution's coalition models are rebuilt under this job's strategy."""
        from frp_flwr.strategies import reconstruction_note

        if self.is_trees:
            return (
                "None: bagged trees cannot be rebuilt per coalition, so sites are credited by "
                "data volume (training examples, ADR 0023)."
            )
        return reconstruction_note(self.strategy_spec or {"name": "fedavg"})

    @property
    def is_trees(self) -> bool:
        """The job trains gradient-boosted trees (``model_spec.kind == "xgboost"``)."""
        return (self.model_spec or {}).get("kind") == "xgboost"

    @property
    def is_terminal(self) -> bool:
        return self.status in JobStatus.terminal()

    @property
    def below_baseline(self) -> bool:
        """The final model is no better than the trivial baseline (flagged on its page)."""
        baseline = self.final_metrics.get("baseline") or {}
        return baseline.get("better") is False


class JobSiteStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    TRAINING = "training", "Training"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    DROPPED = "dropped", "Dropped"


class JobSite(models.Model):
    """One site's participation in a job, with the dataset version it trains on, the resources it
    asks for there and the pool of the site that holds them (``pool``, chosen at launch among
    the site's pools by ``federation.scheduling``)."""

    job = models.ForeignKey(FederatedJob, on_delete=models.CASCADE, related_name="sites")
    site = models.ForeignKey("portal.Site", on_delete=models.PROTECT, related_name="job_sites")
    dataset_version = models.ForeignKey(
        "sandbox.DatasetVersion", on_delete=models.PROTECT, related_name="job_sites"
    )
    status = models.CharField(
        max_length=16, choices=JobSiteStatus.choices, default=JobSiteStatus.PENDING
    )
    node_id = models.CharField(max_length=32, blank=True, help_text="Flower node id (uint64).")
    pool = models.ForeignKey(
        ComputePool,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="job_sites",
        help_text="The site's pool the scheduler chose for this request (set at launch; empty "
        "while queued).",
    )
    cores = models.PositiveIntegerField(default=1, help_text="Cores requested at this site.")
    memory_gib = models.DecimalField(max_digits=9, decimal_places=1, default=Decimal("1"))
    gpus = models.PositiveIntegerField(default=0)
    rounds_completed = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    final_metrics = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["site__slug"]
        constraints = [models.UniqueConstraint(fields=["job", "site"], name="job_site_unique")]

    def __str__(self) -> str:
        return f"{self.job} @ {self.site.slug}"


class RoundMetric(models.Model):
    """The aggregated result of one FedAvg round (example-weighted over replying sites)."""

    job = models.ForeignKey(FederatedJob, on_delete=models.CASCADE, related_name="round_metrics")
    round = models.PositiveIntegerField()
    train_loss = models.FloatField(null=True)
    eval_loss = models.FloatField(null=True)
    eval_accuracy = models.FloatField(null=True)
    # 64-bit, as the contract's counts (frp_flwr.contract.MAX_COUNT = 2**63 - 1).
    num_examples = models.PositiveBigIntegerField(default=0)
    sites_replied = models.PositiveIntegerField(default=0)
    wall_seconds = models.FloatField(null=True, help_text="Server-side duration of the round.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job", "round"]
        constraints = [models.UniqueConstraint(fields=["job", "round"], name="round_metric_unique")]

    def __str__(self) -> str:
        return f"{self.job} round {self.round}"


class SiteRoundMetric(models.Model):
    """One site's reply in one round: examples, loss, accuracy and metering.

    Metered by the site's ClientApp over the round's train and evaluate messages: ``cpu_seconds``
    (process CPU time), ``wall_seconds`` (elapsed), ``bytes_received``/``bytes_sent`` (protobuf
    size of the model ArrayRecords in the messages it received / sent, without gRPC framing).
    """

    job_site = models.ForeignKey(JobSite, on_delete=models.CASCADE, related_name="round_metrics")
    round = models.PositiveIntegerField()
    ok = models.BooleanField(default=True)
    error = models.TextField(blank=True)
    # 64-bit, as the contract's counts (frp_flwr.contract.MAX_COUNT = 2**63 - 1).
    train_examples = models.PositiveBigIntegerField(default=0)
    eval_examples = models.PositiveBigIntegerField(default=0)
    train_loss = models.FloatField(null=True)
    eval_loss = models.FloatField(null=True)
    eval_accuracy = models.FloatField(null=True)
    cpu_seconds = models.FloatField(default=0.0)
    wall_seconds = models.FloatField(default=0.0)
    bytes_received = models.PositiveBigIntegerField(default=0)
    bytes_sent = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["job_site", "round"]
        constraints = [
            models.UniqueConstraint(fields=["job_site", "round"], name="site_round_metric_unique")
        ]

    def __str__(self) -> str:
        return f"{self.job_site} round {self.round}"


# ---------------------------------------------------------------------------------------------
# Airlock: model release
# ---------------------------------------------------------------------------------------------


class ReleaseStatus(models.TextChoices):
    PENDING = "pending", "Awaiting stewards"
    APPROVED = "approved", "Released"
    REFUSED = "refused", "Refused"


class ModelRelease(models.Model):
    """The airlock: a finished job's model leaves only when every participating site approves."""

    job = models.OneToOneField(FederatedJob, on_delete=models.CASCADE, related_name="release")
    status = models.CharField(
        max_length=16, choices=ReleaseStatus.choices, default=ReleaseStatus.PENDING
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"release of {self.job} ({self.status})"


class ReleaseDecision(models.Model):
    """One site's airlock decision, by its data steward or by the dataset's auto-release rule."""

    release = models.ForeignKey(ModelRelease, on_delete=models.CASCADE, related_name="decisions")
    site = models.ForeignKey("portal.Site", on_delete=models.PROTECT, related_name="+")
    approve = models.BooleanField()
    by_rule = models.BooleanField(default=False)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.TextField(blank=True)
    decided_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["release", "site"], name="release_one_decision_per_site"
            )
        ]

    def __str__(self) -> str:
        return f"{self.site} {'approves' if self.approve else 'refuses'} {self.release}"


class SiteNodeStatus(models.TextChoices):
    REGISTERED = "registered", "Registered"
    UNREGISTERED = "unregistered", "Unregistered"


class SiteNode(models.Model):
    """A SuperNode key a site uploaded and the portal registered with the SuperLink.

    Only the public key (OpenSSH line) is here: the site made the pair and keeps the private key.
    ``node_id`` is the id the SuperLink gave at registration (uint64, as text). At most one
    registered key per site; an unregistered one stays as history.
    """

    site = models.ForeignKey("portal.Site", on_delete=models.CASCADE, related_name="supernodes")
    public_key = models.TextField()
    fingerprint = models.CharField(max_length=64, help_text="OpenSSH SHA256 fingerprint.")
    node_id = models.CharField(max_length=24)
    status = models.CharField(
        max_length=16, choices=SiteNodeStatus.choices, default=SiteNodeStatus.REGISTERED
    )
    created_at = models.DateTimeField(auto_now_add=True)
    unregistered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["site__slug", "-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["site"],
                condition=models.Q(status="registered"),
                name="sitenode_one_registered_per_site",
            ),
            models.UniqueConstraint(fields=["node_id"], name="sitenode_unique_node_id"),
        ]

    def __str__(self) -> str:
        return f"{self.site.slug} node {self.node_id} ({self.status})"

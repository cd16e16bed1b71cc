"""Compute pools, federated jobs, per-site participation, round metrics and the airlock.

Sites are the core's (``portal.models.Site``): a pool belongs to a site, a job runs at sites.
"""

from django.conf import settings
from django.db import models


class ComputePool(models.Model):
    """Compute capacity of a site that runs SuperNode work, with a slot capacity.

    A pool belongs to one site (``site.pools``); a site may have several pools.
    """

    site = models.ForeignKey("portal.Site", on_delete=models.CASCADE, related_name="pools")
    name = models.CharField(max_length=100)
    slots = models.PositiveIntegerField(
        default=1, help_text="How many federated jobs may train here at the same time."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__institution__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["site", "name"], name="pool_unique_name"),
            models.CheckConstraint(condition=models.Q(slots__gte=1), name="pool_slots_gte_1"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.site.institution.slug})"

    @property
    def institution(self):
        """The institution of the pool's site (which lends the pool and is paid for it)."""
        return self.site.institution


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
    model = models.CharField(max_length=32, default="logreg")
    strategy = models.CharField(max_length=32, default="fedavg")
    num_rounds = models.PositiveIntegerField(default=5)
    local_epochs = models.PositiveIntegerField(default=5)
    learning_rate = models.FloatField(default=0.1)

    flower_run_id = models.CharField(max_length=32, blank=True, help_text="uint64, as text.")
    callback_seq = models.PositiveBigIntegerField(
        default=0,
        editable=False,
        help_text="Sequence number of the last ServerApp event accepted (each is accepted once).",
    )
    final_metrics = models.JSONField(default=dict, blank=True)
    failure_reason = models.TextField(blank=True, help_text="Reason reported by the ServerApp.")

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
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
    def is_terminal(self) -> bool:
        return self.status in JobStatus.terminal()


class JobSiteStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    TRAINING = "training", "Training"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    DROPPED = "dropped", "Dropped"


class JobSite(models.Model):
    """One site's participation in a job, with the dataset version it trains on."""

    job = models.ForeignKey(FederatedJob, on_delete=models.CASCADE, related_name="sites")
    site = models.ForeignKey("portal.Site", on_delete=models.PROTECT, related_name="job_sites")
    dataset_version = models.ForeignKey(
        "sandbox.DatasetVersion", on_delete=models.PROTECT, related_name="job_sites"
    )
    status = models.CharField(
        max_length=16, choices=JobSiteStatus.choices, default=JobSiteStatus.PENDING
    )
    node_id = models.CharField(max_length=32, blank=True, help_text="Flower node id (uint64).")
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
    num_examples = models.PositiveIntegerField(default=0)
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
    train_examples = models.PositiveIntegerField(default=0)
    eval_examples = models.PositiveIntegerField(default=0)
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

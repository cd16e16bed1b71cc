"""Dataset metadata and access grants. The portal database never holds a row of data."""

from django.conf import settings
from django.db import models


class Dataset(models.Model):
    """A dataset held at one site, registered by that institution's data steward."""

    site = models.ForeignKey("portal.Site", on_delete=models.PROTECT, related_name="datasets")
    slug = models.SlugField()
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    auto_release = models.BooleanField(
        default=False,
        help_text="Airlock rule set by the data steward: approve model releases of jobs that "
        "trained on this dataset without a manual review.",
    )
    shapley_opt_in = models.BooleanField(
        default=False,
        verbose_name="Shapley-value contribution",
        help_text="Consent set by the data steward (ADR 0036): jobs training on this dataset may "
        "measure each site's contribution as a Shapley value. That closing evaluation sends every "
        "site of the job the model of every coalition of sites, including the model trained on "
        "this dataset alone, so the other sites can recover this site's model update. A job in "
        "which any dataset's steward has not opted in is credited by data volume instead.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["site__slug", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["site", "slug"], name="dataset_unique_per_site")
        ]

    def __str__(self) -> str:
        return f"{self.title} @ {self.site.slug}"

    @property
    def latest_version(self):
        """The newest version, or ``None``; from ``prefetch_related("versions")`` when the
        versions were prefetched (no query per dataset on a list page)."""
        cached = getattr(self, "_prefetched_objects_cache", {}).get("versions")
        if cached is not None:
            return max(cached, key=lambda v: v.version, default=None)
        return self.versions.order_by("-version").first()


class DatasetVersion(models.Model):
    """One immutable ingest of a dataset: metadata, schema and a suppressed profile only."""

    dataset = models.ForeignKey(Dataset, on_delete=models.PROTECT, related_name="versions")
    version = models.PositiveIntegerField()
    schema = models.JSONField(help_text='List of {"name": str, "type": "int|float|str"}.')
    row_count = models.PositiveBigIntegerField()
    size_bytes = models.PositiveBigIntegerField(help_text="Ciphertext size in bytes.")
    ciphertext_sha256 = models.CharField(max_length=64)
    store_key = models.CharField(max_length=512, help_text="Object key in the site's store.")
    profile = models.JSONField(default=dict, blank=True)
    # How the source file was read (from ``sandbox.ingest.IngestResult``); blank for versions
    # registered before these were recorded.
    encoding = models.CharField(
        max_length=32, blank=True, help_text='Python codec the source was read with, e.g. "cp1252".'
    )
    encoding_source = models.CharField(
        max_length=16, blank=True, help_text='"declared", "bom" or "detected".'
    )
    delimiter = models.CharField(max_length=2, blank=True, help_text='",", ";" or a tab.')
    delimiter_source = models.CharField(
        max_length=16, blank=True, help_text='"declared", "detected" or "fallback".'
    )
    missing_values = models.JSONField(
        default=list, blank=True, help_text='Cell values read as missing, e.g. ["", "NA"].'
    )
    source_bytes = models.PositiveBigIntegerField(
        null=True, blank=True, help_text="Size of the source file in bytes."
    )
    source_sha256 = models.CharField(
        max_length=64, blank=True, help_text="SHA-256 (hex) of the source file as uploaded."
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["dataset", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "version"], name="dataset_version_unique"),
            models.CheckConstraint(
                condition=models.Q(version__gte=1), name="dataset_version_gte_1"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dataset} v{self.version}"

    @property
    def delimiter_name(self) -> str:
        """The delimiter as a word ("comma", "semicolon", "tab"), or the character itself."""
        from sandbox.csvformat import DELIMITER_NAMES

        return DELIMITER_NAMES.get(self.delimiter, self.delimiter)


class AccessStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    REFUSED = "refused", "Refused"
    REVOKED = "revoked", "Revoked"


class AccessRequest(models.Model):
    """A project's request to use a dataset, decided by the owning institution's data steward."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="access_requests")
    project = models.ForeignKey(
        "portal.Project", on_delete=models.CASCADE, related_name="access_requests"
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    purpose = models.TextField()
    status = models.CharField(
        max_length=16, choices=AccessStatus.choices, default=AccessStatus.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.project} → {self.dataset} ({self.status})"


class PrivacyBudget(models.Model):
    """The ε a project may spend on a dataset over all its differentially private jobs, set by the
    dataset's data steward (ADR 0025). The spending is federation's (jobs); this row is only
    the limit. One per (project, dataset)."""

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="privacy_budgets")
    project = models.ForeignKey(
        "portal.Project", on_delete=models.CASCADE, related_name="privacy_budgets"
    )
    epsilon = models.FloatField(help_text="ε the project may spend on this dataset, in total.")
    set_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["project", "dataset"], name="one_privacy_budget_per_project_dataset"
            ),
            models.CheckConstraint(
                condition=models.Q(epsilon__gt=0), name="privacy_budget_epsilon_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"ε ≤ {self.epsilon:g}: {self.project} on {self.dataset}"

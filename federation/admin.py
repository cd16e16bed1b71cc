"""Django admin for compute pools and jobs."""

from django.contrib import admin

from federation.models import ComputePool, FederatedJob, JobSite, RoundMetric
from federation.selectors import JOB_WIDE_FIELDS
from portal.admin import LargeTableMixin, SafeAutocompleteAdmin


@admin.register(ComputePool)
class ComputePoolAdmin(SafeAutocompleteAdmin):
    list_display = ["name", "site", "slots"]
    list_filter = ["site__institution"]
    autocomplete_fields = ["site"]


class JobSiteInline(admin.TabularInline):
    model = JobSite
    extra = 0
    readonly_fields = [
        "site",
        "dataset_version",
        "status",
        "node_id",
        "rounds_completed",
        "last_error",
    ]


class RoundMetricInline(admin.TabularInline):
    model = RoundMetric
    extra = 0
    readonly_fields = [
        "round",
        "train_loss",
        "eval_loss",
        "eval_accuracy",
        "num_examples",
        "sites_replied",
    ]


@admin.register(FederatedJob)
class FederatedJobAdmin(LargeTableMixin, admin.ModelAdmin):
    list_display = ["id", "title", "project", "status", "flower_run_id", "created_at"]
    list_filter = ["status"]
    search_fields = ["title", "flower_run_id"]
    list_select_related = ["project"]
    list_defer = JOB_WIDE_FIELDS
    readonly_fields = ["callback_seq", "flower_run_id", "final_metrics", "failure_reason"]
    inlines = [JobSiteInline, RoundMetricInline]

"""Accounting in the Django admin (platform admins): the accounting steps of finished jobs, read
only, with an action that retries the selected jobs' accounting through the service."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied

from accounting.models import JobAccountingStep
from accounting.services import steps as services
from federation.selectors import JOB_WIDE_FIELDS
from portal.admin import LargeTableMixin


@admin.register(JobAccountingStep)
class JobAccountingStepAdmin(LargeTableMixin, admin.ModelAdmin):
    list_display = ("job", "step", "status", "attempts", "error", "updated_at")
    list_filter = ("status", "step")
    search_fields = ("job__id", "job__title", "error")
    list_select_related = ("job",)
    list_defer = tuple(f"job__{name}" for name in JOB_WIDE_FIELDS)
    readonly_fields = ("job", "step", "status", "attempts", "error", "detail", "updated_at")
    actions = ["retry_accounting"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    @admin.action(description="Retry the accounting of the selected steps' jobs")
    def retry_accounting(self, request, queryset) -> None:
        jobs = {row.job_id: row.job for row in queryset.select_related("job__project")}
        for job in jobs.values():
            try:
                queued = services.job_accounting_retry(by=request.user, job=job)
            except (services.AccountingError, PermissionDenied) as exc:
                self.message_user(request, f"Job #{job.pk}: {exc}", messages.WARNING)
            else:
                self.message_user(request, f"Job #{job.pk}: queued {', '.join(queued)}.")

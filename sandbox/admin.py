"""Django admin for dataset metadata and access requests (no data is ever stored here)."""

from django.contrib import admin

from portal.admin import LargeTableMixin
from sandbox.models import AccessRequest, Dataset, DatasetVersion


class DatasetVersionInline(admin.TabularInline):
    model = DatasetVersion
    extra = 0
    readonly_fields = [
        "version",
        "row_count",
        "size_bytes",
        "ciphertext_sha256",
        "store_key",
        "created_at",
    ]
    exclude = ["schema", "profile"]


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["title", "slug", "site", "created_at"]
    list_filter = ["site"]
    search_fields = ["title", "slug"]
    inlines = [DatasetVersionInline]


@admin.register(AccessRequest)
class AccessRequestAdmin(LargeTableMixin, admin.ModelAdmin):
    list_display = ["project", "dataset", "status", "expires_at", "decided_by", "created_at"]
    list_filter = ["status"]
    list_select_related = ["project", "dataset__site", "decided_by"]
    list_defer = ("purpose", "decision_reason")

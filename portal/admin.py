"""Django admin for the platform admin: institutions, sites, memberships, projects, audit (read-only)."""

from django.contrib import admin

from portal.models import AuditEvent, Institution, Membership, Project, ProjectMember, Site


@admin.register(Institution)
class InstitutionAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "email_domain", "created_at"]
    search_fields = ["name", "slug", "email_domain"]
    prepopulated_fields = {"slug": ["name"]}


@admin.register(Site)
class SiteAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "institution"]
    list_filter = ["institution"]
    search_fields = ["slug", "name"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "institution", "role", "created_at"]
    list_filter = ["role", "institution"]
    search_fields = ["user__username", "user__email"]
    autocomplete_fields = ["user", "institution"]


class ProjectMemberInline(admin.TabularInline):
    model = ProjectMember
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["title", "slug", "institution", "created_at"]
    search_fields = ["title", "slug"]
    list_filter = ["institution"]
    inlines = [ProjectMemberInline]


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    list_display = ["created_at", "actor", "institution", "action", "target_type", "target_id"]
    list_filter = ["action", "institution"]
    search_fields = ["action", "target_id", "actor__username"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

"""The admin shows the audit of human decisions, and nothing in it can be added, changed or deleted."""

from __future__ import annotations

from django.contrib import admin

from receipts.models import AuditEntry, HumanDecision


class ReadOnlyAdmin(admin.ModelAdmin):
    """Audit rows are shown, never added, changed or deleted."""

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(HumanDecision)
class HumanDecisionAdmin(ReadOnlyAdmin):
    list_display = ("decided_at", "actor", "run", "call_id", "resolution")
    list_filter = ("resolution",)
    search_fields = ("actor", "call_id", "run__run_id")


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "run", "action")
    list_filter = ("action",)
    search_fields = ("actor", "run__run_id")

"""Django admin for the engine's tables. Plain Django: the console applies its role
policy (read-only for viewers) on top, see console/admin.py.

The journal is append-only (a database trigger refuses UPDATE and DELETE), so its admin
is read-only for everyone. Foreign keys to runs use raw id fields: a select box would
load every run.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from sagas.models import (
    ApprovalRequest,
    CompensationItem,
    CompensationPlan,
    JournalEntry,
    WorkerProcess,
    WorkflowRun,
    WorkflowVersion,
)


@admin.register(WorkflowRun)
class WorkflowRunAdmin(admin.ModelAdmin):
    list_display = ("id", "workflow_name", "version", "status", "status_reason", "tenant", "business_key",
                    "attempts", "steps_used", "created_at", "finished_at")
    list_filter = ("status", "workflow_name", "tenant")
    search_fields = ("=id", "business_key")
    raw_id_fields = ("started_by",)
    readonly_fields = ("id", "definition_hash", "fence", "last_seq", "created_at", "updated_at")
    show_full_result_count = False


@admin.register(JournalEntry)
class JournalEntryAdmin(admin.ModelAdmin):
    list_display = ("run_id", "seq", "kind", "name", "worker_id", "created_at")
    list_filter = ("kind",)
    search_fields = ("=run__id",)
    raw_id_fields = ("run",)
    show_full_result_count = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "definition_hash", "module", "first_registered_at", "last_registered_at")
    list_filter = ("name",)
    search_fields = ("name", "definition_hash")


@admin.register(WorkerProcess)
class WorkerProcessAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "pid", "started_at", "last_seen_at", "stopped_at")
    search_fields = ("name", "hostname")


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(admin.ModelAdmin):
    list_display = ("run_id", "step", "state", "requested_at", "deadline", "decided_by_label", "decided_at")
    list_filter = ("state",)
    search_fields = ("=run__id", "step", "decided_by_label")
    raw_id_fields = ("run", "decided_by")
    show_full_result_count = False


class CompensationItemInline(admin.TabularInline):
    model = CompensationItem
    extra = 0
    fields = ("position", "step_name", "connector", "compensation_key", "state", "effect_id",
              "compensation_effect_id")


@admin.register(CompensationPlan)
class CompensationPlanAdmin(admin.ModelAdmin):
    list_display = ("run_id", "state", "trigger", "created_by_label", "created_at", "finished_at")
    list_filter = ("state", "trigger")
    search_fields = ("=run__id", "created_by_label")
    raw_id_fields = ("run", "created_by")
    inlines = (CompensationItemInline,)


@admin.register(CompensationItem)
class CompensationItemAdmin(admin.ModelAdmin):
    list_display = ("plan", "position", "step_name", "connector", "state", "compensation_key")
    list_filter = ("state",)
    search_fields = ("step_name", "compensation_key")
    raw_id_fields = ("plan",)

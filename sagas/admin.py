"""Django admin for the engine's tables. Plain Django: the console applies its role
policy on top (read-only for everyone: changes go through the console), see
console/admin.py.

The journal is append-only (a database trigger refuses UPDATE and DELETE), so its admin
is read-only for everyone. The tables grow to millions of rows, so: foreign keys to runs
use raw id fields (a select box would load every run), search is an exact match on an
indexed column (a run id, or a business key), and no filter needs a DISTINCT scan.

Payloads and free text (a run's input, result and error, journal payloads, approval and
compensation reasons) are shown only redacted (core/redacted_admin.py).
"""

from __future__ import annotations

import uuid

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from core.redacted_admin import ReadOnlyAdmin, RedactedFieldsAdmin
from sagas.models import (
    ApprovalRequest,
    ArchivedRun,
    CompensationItem,
    CompensationPlan,
    InFlightCount,
    InFlightCountDelta,
    JournalEntry,
    RunCount,
    RunCountDelta,
    Schedule,
    ScheduleTick,
    SweepTurn,
    WorkerProcess,
    WorkflowPause,
    WorkflowRun,
    WorkflowVersion,
)


class ExactRunSearch(RedactedFieldsAdmin):
    """Search box: a run id finds that run's rows; anything else is matched exactly against
    ``text_field`` (if any). Both use an index."""

    run_field = "run_id"
    text_field = ""

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(**{self.run_field: uuid.UUID(term)}), False
        except ValueError:
            return (queryset.filter(**{self.text_field: term}) if self.text_field else queryset.none()), False


@admin.register(WorkflowRun)
class WorkflowRunAdmin(ExactRunSearch):
    list_display = ("id", "workflow_name", "version", "status", "status_reason", "tenant", "business_key",
                    "attempts", "steps_used", "created_at", "finished_at")
    list_filter = ("status",)
    search_fields = ("id", "business_key")  # see ExactRunSearch
    search_help_text = "A run id, or a business key (exact)."
    run_field, text_field = "id", "business_key"
    redacted_fields = ("input", "result", "error")
    raw_id_fields = ("started_by",)
    readonly_fields = ("id", "definition_hash", "fence", "last_seq", "created_at", "updated_at")
    show_full_result_count = False


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin, ExactRunSearch):
    list_display = ("run_id", "seq", "kind", "name", "worker_id", "created_at")
    search_fields = ("run__id",)  # see ExactRunSearch
    search_help_text = "A run id."
    raw_id_fields = ("run",)
    redacted_fields = ("payload",)
    show_full_result_count = False


@admin.register(WorkflowVersion)
class WorkflowVersionAdmin(admin.ModelAdmin):
    list_display = ("name", "version", "definition_hash", "module", "first_registered_at", "last_registered_at")
    list_filter = ("name",)
    search_fields = ("name", "definition_hash")


@admin.register(WorkflowPause)
class WorkflowPauseAdmin(admin.ModelAdmin):
    """Read-only here like every engine table (console/admin.py): pauses are set and lifted on
    the versions page, the HTTP API or ``sagas.pause_workflow``, which audit them."""

    list_display = ("workflow_name", "version", "paused_by_label", "reason", "created_at")
    search_fields = ("workflow_name",)


@admin.register(WorkerProcess)
class WorkerProcessAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "pid", "started_at", "last_seen_at", "stopped_at")
    search_fields = ("name", "hostname")


@admin.register(RunCount)
class RunCountAdmin(ReadOnlyAdmin):
    """Runs per tenant, status and reason (``sagas.store.counts``; ``manage.py sagas_recount``)."""

    list_display = ("tenant", "status", "status_reason", "n")
    list_filter = ("status",)


@admin.register(RunCountDelta)
class RunCountDeltaAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "status", "status_reason", "n")


@admin.register(InFlightCount)
class InFlightCountAdmin(ReadOnlyAdmin):
    """Runs in flight per tenant, version and status (``sagas.store.counts``; ``manage.py sagas_recount``)."""

    list_display = ("tenant", "workflow_name", "version", "definition_hash", "status", "n")
    list_filter = ("status",)


@admin.register(InFlightCountDelta)
class InFlightCountDeltaAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "workflow_name", "version", "definition_hash", "status", "n")


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ExactRunSearch):
    list_display = ("run_id", "step", "state", "requested_at", "deadline", "decided_by_label", "decided_at")
    list_filter = ("state",)
    search_fields = ("run__id",)  # see ExactRunSearch
    search_help_text = "A run id."
    raw_id_fields = ("run", "decided_by")
    redacted_fields = ("reason", "comment")
    show_full_result_count = False


class CompensationItemInline(admin.TabularInline):
    model = CompensationItem
    extra = 0
    fields = ("position", "step_name", "connector", "compensation_key", "state", "effect_id",
              "compensation_effect_id")


@admin.register(CompensationPlan)
class CompensationPlanAdmin(ExactRunSearch):
    list_display = ("run_id", "state", "trigger", "created_by_label", "created_at", "finished_at")
    list_filter = ("state",)
    search_fields = ("run__id",)  # see ExactRunSearch
    search_help_text = "A run id."
    raw_id_fields = ("run", "created_by")
    redacted_fields = ("reason",)
    inlines = (CompensationItemInline,)


@admin.register(CompensationItem)
class CompensationItemAdmin(admin.ModelAdmin):
    list_display = ("plan", "position", "step_name", "connector", "state", "compensation_key")
    list_filter = ("state",)
    search_fields = ("=compensation_key",)
    raw_id_fields = ("plan",)


@admin.register(ArchivedRun)
class ArchivedRunAdmin(ExactRunSearch):
    """Where retention put each archived run (the console opens it from there)."""

    list_display = ("run_id", "workflow_name", "version", "status", "tenant", "business_key", "finished_at",
                    "archived_at", "location")
    list_filter = ("status",)
    search_fields = ("run_id", "business_key")  # see ExactRunSearch
    search_help_text = "A run id, or a business key (exact)."
    text_field = "business_key"
    show_full_result_count = False


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    """Read-only: schedules change through the console or the API, which audit each change."""

    list_display = ("name", "workflow_name", "tenant", "cron", "timezone", "every", "overlap", "catch_up", "paused",
                    "due_at")
    search_fields = ("name", "workflow_name")


@admin.register(ScheduleTick)
class ScheduleTickAdmin(ReadOnlyAdmin):
    list_display = ("schedule", "tick_at", "outcome", "how", "run_id", "handled_at")
    list_filter = ("outcome", "how")


@admin.register(SweepTurn)
class SweepTurnAdmin(ReadOnlyAdmin):
    list_display = ("id", "swept_at")

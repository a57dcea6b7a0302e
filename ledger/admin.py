"""Django admin for the side-effect ledger. Plain Django: the console applies its role
policy on top (read-only for everyone: changes go through the console), see
console/admin.py. Payloads and notes are shown only redacted (core/redacted_admin.py)."""

from __future__ import annotations

import uuid

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from core.redacted_admin import RedactedFieldsAdmin
from ledger.models import (
    CircuitChange,
    ConnectorFlow,
    EffectKeyIndex,
    EffectRecord,
    FlowBucket,
    FlowTicket,
    SpendDay,
    SpendLimit,
)


@admin.register(EffectRecord)
class EffectRecordAdmin(RedactedFieldsAdmin):
    list_display = ("id", "tenant", "idempotency_key", "kind", "connector", "step_name", "status", "attempts",
                    "intent_at", "completed_at", "resolution")
    list_filter = ("status", "kind")
    search_fields = ("run_id", "idempotency_key")  # exact, see get_search_results
    search_help_text = "A run id, or an idempotency key (exact)."
    raw_id_fields = ("resolved_by",)
    readonly_fields = ("payload_hash", "intent_at", "updated_at")
    redacted_fields = ("request_payload", "result", "error_message", "resolution_note")
    show_full_result_count = False

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(run_id=uuid.UUID(term)), False
        except ValueError:
            return queryset.filter(idempotency_key=term), False


@admin.register(EffectKeyIndex)
class EffectKeyIndexAdmin(RedactedFieldsAdmin):
    """Keys of archived effects, kept for deduplication until ``expires_at``."""

    list_display = ("tenant", "idempotency_key", "connector", "status", "run_id", "expires_at")
    list_filter = ("status",)
    search_fields = ("idempotency_key",)
    redacted_fields = ("result", "error_message")
    show_full_result_count = False


@admin.register(ConnectorFlow)
class ConnectorFlowAdmin(admin.ModelAdmin):
    """Flow-control settings; staff change them on the console's connectors page (audited)."""

    list_display = ("connector", "rate", "burst", "max_in_flight", "key_field", "circuit_failures", "paused_at",
                    "changed_by_label")


@admin.register(FlowBucket)
class FlowBucketAdmin(admin.ModelAdmin):
    list_display = ("connector", "key", "circuit", "failures", "opened_at", "tat")
    list_filter = ("circuit",)


@admin.register(FlowTicket)
class FlowTicketAdmin(admin.ModelAdmin):
    list_display = ("id", "connector", "key", "lane", "tag", "state", "reason", "run_id", "created_at")
    list_filter = ("state", "reason")
    raw_id_fields = ("effect",)
    show_full_result_count = False


@admin.register(CircuitChange)
class CircuitChangeAdmin(admin.ModelAdmin):
    list_display = ("at", "connector", "key", "state", "failures")
    list_filter = ("state",)


@admin.register(SpendLimit)
class SpendLimitAdmin(admin.ModelAdmin):
    list_display = ("tenant", "connector", "per_day", "changed_by_label", "changed_at")


@admin.register(SpendDay)
class SpendDayAdmin(admin.ModelAdmin):
    list_display = ("day", "tenant", "connector", "spent")
    list_filter = ("day",)

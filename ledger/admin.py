"""Django admin for the side-effect ledger. Plain Django: the console applies its role
policy (read-only for viewers) on top, see console/admin.py."""

from __future__ import annotations

from django.contrib import admin

from ledger.models import EffectRecord


@admin.register(EffectRecord)
class EffectRecordAdmin(admin.ModelAdmin):
    list_display = ("id", "tenant", "idempotency_key", "kind", "connector", "step_name", "status", "attempts",
                    "intent_at", "completed_at", "resolution")
    list_filter = ("status", "kind", "connector")
    search_fields = ("idempotency_key", "=run_id", "downstream_ref")
    raw_id_fields = ("resolved_by",)
    readonly_fields = ("payload_hash", "intent_at", "updated_at")
    show_full_result_count = False

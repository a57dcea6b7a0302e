"""Django admin for the simulated providers' own books. Plain Django: the console applies
its role policy (read-only for viewers) on top, see console/admin.py."""

from __future__ import annotations

from django.contrib import admin

from core.redacted_admin import RedactedFieldsAdmin
from demo.models import ProviderExecution, ProviderFault, ProviderLimit, ProviderReplay, WebhookArrival


@admin.register(ProviderExecution)
class ProviderExecutionAdmin(RedactedFieldsAdmin):
    list_display = ("id", "provider", "operation", "idempotency_key", "status_code", "caller_pid", "created_at")
    list_filter = ("provider", "operation", "status_code")
    search_fields = ("idempotency_key",)
    redacted_fields = ("request", "response")


@admin.register(ProviderReplay)
class ProviderReplayAdmin(admin.ModelAdmin):
    list_display = ("id", "execution", "caller_pid", "created_at")
    raw_id_fields = ("execution",)


@admin.register(ProviderFault)
class ProviderFaultAdmin(admin.ModelAdmin):
    list_display = ("provider", "operation", "fault", "remaining", "created_at")
    list_filter = ("provider", "operation")


@admin.register(WebhookArrival)
class WebhookArrivalAdmin(RedactedFieldsAdmin):
    list_display = ("id", "received_at", "signature_ok", "kind", "delivery", "idempotency_key")
    redacted_fields = ("body", "summary")
    list_filter = ("signature_ok", "kind")
    search_fields = ("idempotency_key", "delivery")


@admin.register(ProviderLimit)
class ProviderLimitAdmin(admin.ModelAdmin):
    list_display = ("provider", "operation", "per_second", "refused")

"""Django admin for notifications: read-only, like every console table (staff change endpoints on
the console's page, where each change is audited). No secret is ever shown here (nor the one a
rotation replaced)."""

from __future__ import annotations

from django.contrib import admin

from console.admin import ReadOnlyAdmin
from console.notifications.models import NotificationDelivery, NotificationEndpoint


@admin.register(NotificationEndpoint)
class NotificationEndpointAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "format", "signature_scheme", "active", "updated_at")
    exclude = ("secret", "previous_secret", "url")  # a Slack webhook URL is a credential too
    list_filter = ("active", "format")


@admin.register(NotificationDelivery)
class NotificationDeliveryAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "endpoint", "kind", "item", "tenant", "workflow", "notify_run_id")
    list_filter = ("kind",)
    search_fields = ("item", "business_key")
    redacted_fields = ("body", "summary")
    raw_id_fields = ("endpoint",)
    show_full_result_count = False

"""Read-only admin for API keys and webhooks in. Never a secret: a key's hash and a hook's
secret are not shown. Keys are made with ``manage.py createapikey`` and expired or revoked
on the console's API keys page (audited); hooks are made by the hooks' command or code."""

from __future__ import annotations

from django.contrib import admin

from api.models import ApiKey, Hook
from core.redacted_admin import ReadOnlyAdmin


@admin.register(ApiKey)
class ApiKeyAdmin(ReadOnlyAdmin):
    list_display = ("name", "role", "state", "created_at", "expires_at", "revoked_at", "last_used_at",
                    "rate_per_minute")
    search_fields = ("name", "prefix")
    fields = readonly_fields = ("name", "prefix", "role", "user", "created_by", "created_at", "expires_at",
                                "revoked_at", "revoked_by", "last_used_at", "rate_per_minute")


@admin.register(Hook)
class HookAdmin(ReadOnlyAdmin):
    list_display = ("name", "signal", "workflow", "tenant", "signature_scheme", "enabled", "created_at")
    search_fields = ("name", "signal")
    fields = readonly_fields = ("name", "signal", "workflow", "tenant", "signature_scheme", "previous_scheme",
                                "previous_until", "enabled", "created_at")

"""Read-only admin for API keys and webhooks in. Never a secret: a key's hash and a hook's
secret are not shown. Keys are made with ``manage.py createapikey`` and expired or revoked
on the console's API keys page (audited); hooks are made by the hooks' command or code."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from api.models import ApiKey, Hook


class _ReadOnly(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(ApiKey)
class ApiKeyAdmin(_ReadOnly):
    list_display = ("name", "role", "state", "created_at", "expires_at", "revoked_at", "last_used_at",
                    "rate_per_minute")
    search_fields = ("name", "prefix")
    fields = readonly_fields = ("name", "prefix", "role", "user", "created_by", "created_at", "expires_at",
                                "revoked_at", "revoked_by", "last_used_at", "rate_per_minute")


@admin.register(Hook)
class HookAdmin(_ReadOnly):
    list_display = ("name", "signal", "workflow", "tenant", "enabled", "created_at")
    search_fields = ("name", "signal")
    fields = readonly_fields = ("name", "signal", "workflow", "tenant", "enabled", "created_at")

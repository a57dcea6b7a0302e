"""The Django admin's user pages, with the console's additions: a user's tenant limit is edited
on their page (an inline; no limit: every tenant), and every save of the page is one audited
role change made by the admin's user (console/user_audit.py), in the page's transaction.

``register`` (called from ``ConsoleConfig.ready``) puts this admin in place of the one
``django.contrib.auth`` registered, and lists the tenant limits read-only on their own (the
console's policy makes every console model read-only there: console/admin.py).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User
from django.db import transaction
from django.http import HttpRequest, HttpResponse

from console.user_audit import role_changes
from operators.models import TenantScope


class TenantScopeInline(admin.StackedInline):
    model = TenantScope
    fields = ("tenants",)
    max_num = 1
    can_delete = True
    verbose_name = "tenant limit"
    verbose_name_plural = "tenant limit (none: the user sees every tenant; delete it to remove the limit)"


class ConsoleUserAdmin(UserAdmin):
    inlines = (*UserAdmin.inlines, TenantScopeInline)

    def changeform_view(self, request: HttpRequest, object_id: str | None = None, form_url: str = "",
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        actor = request.user if isinstance(request.user, User) else None  # the admin has only staff users
        with transaction.atomic(), role_changes(actor):
            return super().changeform_view(request, object_id, form_url, extra_context)


class TenantScopeAdmin(admin.ModelAdmin):
    list_display = ("user", "tenants")
    search_fields = ("user__username",)


def register(site: admin.AdminSite = admin.site) -> None:
    """Idempotent."""
    user_model = get_user_model()
    if site.is_registered(user_model):
        if isinstance(site.get_model_admin(user_model), ConsoleUserAdmin):
            return
        site.unregister(user_model)
    site.register(user_model, ConsoleUserAdmin)
    if not site.is_registered(TenantScope):
        site.register(TenantScope, TenantScopeAdmin)

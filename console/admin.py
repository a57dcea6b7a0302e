"""Admin for the audit log, and the console's role policy over the whole Django admin.

Every model of ledger, sagas, console and demo is registered by its own app's admin.py
(plain Django, no roles: those apps know nothing of the console). The console owns the
roles, so it applies the policy to all of them once every admin module is loaded
(``apply_viewer_policy``, called from ``ConsoleConfig.ready``):

* a staff user with a console role may view every model (auditors read everything);
* the engine's and the ledger's state (every model of ``sagas``, ``ledger`` and
  ``console``) and the providers' books of executions are read-only for everyone,
  superusers included. A change there must go through the console's services,
  which check the user's role, refuse stale pages and write the audit entry in the
  same transaction; an admin form would do none of that, and an edited run or
  effect record would silently disagree with its journal;
* in the remaining models (the demo providers' injected faults) a staff user in the
  viewer group who is neither operator nor superuser can add, change and delete
  nothing, whatever Django permissions they were given;
* a user limited to some tenants (operators/selectors/tenancy.py) sees none of these
  models here: the admin is not tenant-scoped, the console's pages are.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.contrib import admin
from django.http import HttpRequest

from console.models import BulkBatch, BulkItem, SsoIdentity
from core.redacted_admin import ReadOnlyAdmin as KeptAdmin
from core.redacted_admin import RedactedFieldsAdmin
from operators import roles
from operators.models import AuditEntry, DualControlRequest
from operators.selectors.tenancy import tenants_of

log = logging.getLogger("console.admin")

POLICY_APPS = ("ledger", "sagas", "operators", "console", "demo")
# Read-only in the admin for everyone: only services change them (see the module docstring).
SERVICE_OWNED = frozenset({"ledger", "sagas", "operators", "console", "demo.providerexecution", "demo.providerreplay"})


class ReadOnlyAdmin(KeptAdmin, RedactedFieldsAdmin):
    """For append-only tables: nobody adds, changes or deletes rows here; payloads redacted."""


def is_viewer_only(user: Any) -> bool:
    if not user.is_active or not user.is_staff or user.is_superuser:
        return False
    held = roles.roles_of(user)
    return roles.VIEWER in held and roles.OPERATOR not in held


def _may_read(user: Any) -> bool:
    return user.is_active and user.is_staff and roles.can_view(user)


def _tenant_limited(user: Any) -> bool:
    """Limited to some tenants (operators/selectors/tenancy.py). The admin lists every tenant's rows,
    so it shows such a user none of these models, whatever Django permissions they hold."""
    return tenants_of(user) is not None


# Mixed into ModelAdmin subclasses and calling theirs through super(): to the type checker a
# ModelAdmin, at run time a plain class in front of one in the MRO.
if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = object


class ConsoleRolePolicy(_ModelAdmin):
    """Mixed in front of every ModelAdmin of the policy apps (see the module docstring)."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if _tenant_limited(request.user):
            return False
        return _may_read(request.user) or super().has_view_permission(request, obj)

    def has_module_permission(self, request: HttpRequest) -> bool:
        if _tenant_limited(request.user):
            return False
        return _may_read(request.user) or super().has_module_permission(request)

    def _may_write(self, request: HttpRequest) -> bool:
        meta = self.model._meta
        owned = meta.app_label in SERVICE_OWNED or meta.label_lower in SERVICE_OWNED
        return not owned and not is_viewer_only(request.user) and not _tenant_limited(request.user)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return self._may_write(request) and super().has_add_permission(request, *args)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_write(request) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_write(request) and super().has_delete_permission(request, obj)


def apply_viewer_policy(site: admin.AdminSite = admin.site) -> None:
    """Re-register each ModelAdmin of the policy apps with ``ConsoleRolePolicy`` in front.

    Idempotent. A model of those apps without an admin is logged (and fails
    tests/console/test_admin.py): "the Django admin covers every model".
    """
    installed = {config.label for config in apps.get_app_configs()}
    for label in (label for label in POLICY_APPS if label in installed):  # the demo is opt-in
        for model in apps.get_app_config(label).get_models():
            if not site.is_registered(model):
                log.error("%s has no admin; register it in %s/admin.py", model._meta.label, label)
                continue
            current = type(site.get_model_admin(model))
            if issubclass(current, ConsoleRolePolicy):
                continue
            site.unregister(model)
            policy = type(current.__name__, (ConsoleRolePolicy, current), {"__module__": current.__module__})
            site.register(model, policy)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor_label", "action", "object_type", "object_id", "outcome")
    list_filter = ("outcome", "action", "object_type")
    search_fields = ("actor_label", "object_id")
    redacted_fields = ("before", "after", "reason", "message")
    date_hierarchy = "created_at"
    show_full_result_count = False


@admin.register(DualControlRequest)
class DualControlRequestAdmin(ReadOnlyAdmin):
    """Read-only: a request is confirmed or refused in the console's inbox, audited."""

    list_display = ("id", "created_at", "requested_by_label", "action", "object_type", "object_id", "state",
                    "decided_by_label")
    list_filter = ("state", "action")
    search_fields = ("requested_by_label", "decided_by_label", "object_id")
    redacted_fields = ("reason", "decision_reason", "params", "seen", "result")
    show_full_result_count = False


@admin.register(BulkBatch)
class BulkBatchAdmin(ReadOnlyAdmin):
    list_display = ("id", "created_at", "user_label", "action", "state", "total", "ok", "refused", "denied")
    list_filter = ("state", "action")
    search_fields = ("user_label",)
    redacted_fields = ("reason", "evidence", "selection")
    show_full_result_count = False


@admin.register(BulkItem)
class BulkItemAdmin(ReadOnlyAdmin):
    list_display = ("id", "batch", "object_type", "object_id", "expected", "outcome", "acted_at")
    list_filter = ("outcome", "object_type")
    search_fields = ("object_id",)
    redacted_fields = ("message",)
    raw_id_fields = ("batch",)
    show_full_result_count = False


@admin.register(SsoIdentity)
class SsoIdentityAdmin(ReadOnlyAdmin):
    """Which user each subject at the OpenID Connect provider signs in as (made at the first sign-in;
    console/services/sso.py). Deleting the user removes the link."""

    list_display = ("user", "subject", "created_at")
    search_fields = ("subject", "user__username")
    raw_id_fields = ("user",)
    show_full_result_count = False

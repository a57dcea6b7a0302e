"""Tenant scoping: which tenants' runs, effects, approvals and audit entries a user may see.

A user with no ``TenantScope`` row sees every tenant (the default). A user with one sees only
the tenants it lists, and none if the list is empty: removing a tenant never widens the scope.
Superusers see every tenant whatever their row says (they own the admin, which is not scoped).

Every console read goes through ``scope`` (or ``scope_runs``) with the user, so an object outside
the user's tenants is, for that user, an object that does not exist: lists leave it out, counts
do not count it, pages about it answer 404 (not 403, which would say it exists), and actions on
it are refused as not found.

Audit entries carry the tenant of the object they are about (``AuditEntry.tenant``); entries
about no tenant's object (a user's roles, logins) have an empty tenant and are shown only to
users who see every tenant.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.contrib.auth import models as auth_models
from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet

from ledger.models import EffectRecord
from operators.models import TenantScope
from sagas.models import ApprovalRequest, Schedule, WorkflowRun

M = TypeVar("M", bound=Model)
User = auth_models.User | auth_models.AnonymousUser


def tenants_of(user: User) -> list[str] | None:
    """The tenants ``user`` may see, sorted; None: every tenant. Anonymous: none.
    Cached on the user object (one request, one websocket push)."""
    if not user.is_authenticated:
        return []
    if user.is_superuser:
        return None
    cache = vars(user)
    if "console_tenants" not in cache:
        row = TenantScope.objects.filter(user_id=user.pk).values_list("tenants", flat=True).first()
        cache["console_tenants"] = None if row is None else sorted(set(row))
    tenants: list[str] | None = cache["console_tenants"]
    return tenants


def may_see(user: User, tenant: str) -> bool:
    tenants = tenants_of(user)
    return tenants is None or tenant in tenants


def scope(qs: QuerySet[M], user: User, *, field: str = "tenant") -> QuerySet[M]:
    """``qs`` narrowed to the rows whose ``field`` (a tenant column, or a path to one such as
    ``run__tenant``) is one of the user's tenants; unchanged for a user who sees every tenant."""
    tenants = tenants_of(user)
    if tenants is None:
        return qs
    return qs.filter(**{f"{field}__in": tenants})


def scoped_get(qs: QuerySet[M], user: User, object_id: Any, *, field: str = "tenant") -> M | None:
    """The row of ``qs`` with ``object_id`` if it is in the user's tenants (``scope``), else None."""
    return scope(qs, user, field=field).filter(id=object_id).first()


def scope_runs(qs: QuerySet[WorkflowRun], user: User) -> QuerySet[WorkflowRun]:
    return scope(qs, user, field="tenant")


def object_tenant(object_type: str, object_id: Any) -> str | None:
    """The tenant of the object an action or an audit entry is about ("run", "effect",
    "approval", "schedule": the tenant of the runs it starts); "" for other kinds (they belong
    to no tenant); None for an id that names nothing."""
    try:
        if object_type == "run":
            found = WorkflowRun.objects.filter(id=object_id).values_list("tenant", flat=True).first()
        elif object_type == "effect":
            found = EffectRecord.objects.filter(id=int(object_id)).values_list("tenant", flat=True).first()
        elif object_type == "approval":
            found = ApprovalRequest.objects.filter(id=int(object_id)).values_list("run__tenant", flat=True).first()
        elif object_type == "schedule":
            found = (Schedule.objects.filter(name=str(object_id)).values_list("tenant", flat=True).first()
                     if "\x00" not in str(object_id) else None)
        else:
            return ""
    except (ValidationError, ValueError, TypeError, OverflowError):  # a malformed id names nothing
        return None
    return found

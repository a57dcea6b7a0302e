"""Reads for the audit log page and its CSV export: the entries about the user's tenants
(``AuditEntry.tenant``; entries about no tenant only for users who see every tenant)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import QuerySet

from console.models import AuditEntry
from console.roles import ACTION_ROLES
from console.selectors.paging import Cursor, Page, keyset_page
from console.selectors.tenancy import User, scope

AUDIT_PAGE_SIZE = 50  # each entry renders its before/after payloads; 100 put the p95 over 100 ms at scale


@dataclass(frozen=True)
class AuditFilters:
    """The audit log's filters, already validated (console.forms.AuditFilterForm). Empty values
    filter nothing."""

    actor: str = ""
    action: str = ""
    object_type: str = ""
    object_id: str = ""
    outcome: str = ""
    since: datetime | None = None
    until: datetime | None = None


def audit_entries(filters: AuditFilters, *, user: User) -> QuerySet[AuditEntry]:
    """Audit entries about ``user``'s tenants matching every given filter (unordered:
    ``audit_page`` orders them)."""
    qs = scope(AuditEntry.objects.all(), user)
    if filters.actor:
        qs = qs.filter(actor_label=filters.actor)
    if filters.action:
        qs = qs.filter(action=filters.action)
    if filters.object_type:
        qs = qs.filter(object_type=filters.object_type)
    if filters.object_id:
        qs = qs.filter(object_id=filters.object_id)
    if filters.outcome:
        qs = qs.filter(outcome=filters.outcome)
    if filters.since:
        qs = qs.filter(created_at__gte=filters.since)
    if filters.until:
        qs = qs.filter(created_at__lt=filters.until)
    return qs


def audit_page(filters: AuditFilters, *, user: User, cursor: Cursor | None = None,
               size: int = AUDIT_PAGE_SIZE) -> Page[AuditEntry]:
    """One keyset page of matching entries, newest first (``created_at`` desc, ``id`` desc)."""
    return keyset_page(audit_entries(filters, user=user), field="created_at", descending=True, cursor=cursor, size=size)


def audit_known_values() -> dict[str, list[str]]:
    """Suggestions for the filter pickers (free text is accepted too). Taken from the roles
    table rather than the log, which would need a scan of the whole table."""
    actions = sorted(ACTION_ROLES)
    return {"actions": actions, "object_types": sorted({a.split(".", 1)[0] for a in actions})}

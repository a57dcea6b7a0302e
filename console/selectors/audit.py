"""Reads for the audit log page and its CSV export: the entries about the user's tenants
(``AuditEntry.tenant``; entries about no tenant only for users who see every tenant)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlencode

from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.urls import NoReverseMatch, reverse

from console.models import BulkBatch
from ledger.models import EffectRecord
from operators.actors import is_system_label
from operators.models import AuditEntry
from operators.roles import ACTION_ROLES
from operators.selectors.paging import Cursor, Page, keyset_page
from operators.selectors.tenancy import User, scope, scope_runs
from sagas.models import ApprovalRequest, WorkflowRun

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


# --- what each entry is about: a link to its object and the business key of its run ---------


@dataclass(frozen=True)
class AuditRow:
    """An entry as the log shows it: ``url`` leads to its object ("" when there is none to
    show), ``object_label`` names it, ``run_id`` and ``business_key`` are those of the run it
    concerns (empty when it concerns none)."""

    entry: AuditEntry
    url: str
    object_label: str
    run_id: str = ""
    business_key: str = ""

    @property
    def is_system(self) -> bool:
        return is_system_label(self.entry.actor_label)


def _ints(ids: Iterable[str]) -> list[int]:
    return [int(i) for i in ids if i.isdigit() and len(i) < 19]


def _uuids(ids: Iterable[str]) -> list[uuid.UUID]:
    found = []
    for i in ids:
        try:
            found.append(uuid.UUID(i))
        except ValueError:
            continue
    return found


def _admin_user_url(object_id: str) -> str:
    try:
        if object_id.isdigit():
            return reverse("admin:auth_user_change", args=[int(object_id)])
        return f"{reverse('admin:auth_user_changelist')}?{urlencode({'q': object_id})}"
    except NoReverseMatch:
        return ""


def audit_rows(entries: list[AuditEntry], *, user: User) -> list[AuditRow]:
    """``entries`` with links and business keys, in five queries whatever their number (the
    approvals, effects, runs, users and bulk batches they name). Objects are looked up within
    ``user``'s tenants, so a run, approval or effect link never leads to a 404; a bulk batch links
    to its page, users to the admin's user page for staff who may view it."""
    ids: dict[str, set[str]] = {}
    for e in entries:
        ids.setdefault(e.object_type, set()).add(e.object_id)
    approvals = {str(a["id"]): a for a in scope(
        ApprovalRequest.objects.filter(id__in=_ints(ids.get("approval", ()))), user, field="run__tenant")
        .values("id", "step", "run_id", "run__business_key")}
    effects = {str(f["id"]): f for f in scope(EffectRecord.objects.filter(id__in=_ints(ids.get("effect", ()))), user)
               .values("id", "step_name", "run_id")}
    run_ids = {*_uuids(ids.get("run", ())), *(f["run_id"] for f in effects.values())}
    runs = {str(r["id"]): r["business_key"] for r in
            scope_runs(WorkflowRun.objects.filter(id__in=run_ids), user).values("id", "business_key")}
    names = {str(pk): name for pk, name in
             get_user_model().objects.filter(pk__in=_ints(ids.get("user", ()))).values_list("pk", "username")}
    batches = {str(pk): token for pk, token in
               BulkBatch.objects.filter(id__in=_ints(ids.get("bulk_batch", ()))).values_list("id", "token")}
    staff = bool(getattr(user, "is_staff", False)) and user.has_perm("auth.view_user")
    rows = []
    for e in entries:
        kind, oid = e.object_type, e.object_id
        if kind == "run" and oid in runs:
            rows.append(AuditRow(e, reverse("console:run", args=[oid]), f"run {oid[:8]}…", oid, runs[oid]))
        elif kind == "approval" and oid in approvals:
            a = approvals[oid]
            url = f"{reverse('console:run', args=[a['run_id']])}#run-approval-{oid}"
            rows.append(AuditRow(e, url, f"approval {oid} ({a['step']})", str(a["run_id"]), a["run__business_key"]))
        elif kind == "effect" and oid in effects:
            f = effects[oid]
            url = f"{reverse('console:run', args=[f['run_id']])}#run-effect-{oid}"
            run_id = str(f["run_id"])
            rows.append(AuditRow(e, url, f"effect {oid} ({f['step_name']})", run_id, runs.get(run_id, "")))
        elif kind == "user":
            rows.append(AuditRow(e, _admin_user_url(oid) if staff else "", f"user {names.get(oid, oid)}"))
        elif kind == "bulk_batch" and oid in batches:
            rows.append(AuditRow(e, reverse("console:bulk_batch", args=[batches[oid]]), f"batch {oid}"))
        else:
            rows.append(AuditRow(e, "", f"{kind} {oid}"))
    return rows

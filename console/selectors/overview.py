"""Reads for the overview page: runs by status, the queues that need a person, runs per minute.

Everything is counted within the user's tenants (console/selectors/tenancy.py).
Three queries whatever the data: one count by status, one ``UNION ALL`` of the queues' counts
and oldest items, one for the per-minute chart. The page is re-rendered on every push to every
open overview, so its cost is paid often.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import CharField, Count, F, Min, QuerySet, Value
from django.utils import timezone

from console.selectors.tenancy import User, scope, scope_runs, tenants_of
from ledger.models import EffectRecord, EffectStatus
from sagas.models import (
    OPEN_APPROVAL_STATES,
    ApprovalRequest,
    CompensationItem,
    CompensationItemState,
    RunStatus,
    WorkflowRun,
)

# (label, key in the union, the page that works the queue)
QUEUES = (
    ("Unknown effects", "unknown_effects", "console:effects"),
    ("Pending approvals", "approvals", "console:approvals"),
    ("Failed compensations", "failed_compensations", "console:runs"),
    ("Version mismatches", "version_mismatch", "console:versions"),
    ("Exhausted budgets", "budget_exceeded", "console:runs"),
)
# NEEDS_ATTENTION reasons that are queues of their own (the key is the reason)
_ATTENTION_QUEUES = ("version_mismatch", "budget_exceeded")


def _age(since: datetime | None) -> float | None:
    return (timezone.now() - since).total_seconds() if since else None


def _queue(qs: QuerySet[Any], key: str, oldest: str) -> QuerySet[Any]:
    """One row: ``(key, count, oldest)`` of ``qs`` (an aggregate without GROUP BY)."""
    return qs.annotate(key=Value(key, output_field=CharField())).values("key").annotate(
        n=Count("pk"), oldest=Min(oldest)).order_by()


def _queues(user: User) -> dict[str, tuple[int, datetime | None]]:
    """Every queue's size and the time its oldest item started waiting, in one query."""
    unknown = scope(EffectRecord.objects.filter(status=EffectStatus.UNKNOWN), user)
    approvals = scope(ApprovalRequest.objects.filter(state__in=OPEN_APPROVAL_STATES,
                                                     run__status__in=[RunStatus.WAITING, RunStatus.NEEDS_ATTENTION]),
                      user, field="run__tenant")
    failed = scope(CompensationItem.objects.filter(state__in=[CompensationItemState.FAILED,
                                                              CompensationItemState.UNKNOWN]),
                   user, field="plan__run__tenant")
    attention = (
        scope_runs(WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION, status_reason__in=_ATTENTION_QUEUES),
                   user)
        .values(key=F("status_reason")).annotate(n=Count("pk"), oldest=Min("updated_at")).order_by()
    )
    union = _queue(unknown, "unknown_effects", "intent_at").union(
        _queue(approvals, "approvals", "requested_at"),
        _queue(failed, "failed_compensations", "plan__created_at"),
        attention,
        all=True,
    )
    return {row["key"]: (row["n"], row["oldest"]) for row in union}


def overview(*, user: User) -> dict[str, Any]:
    runs = scope_runs(WorkflowRun.objects.all(), user)
    counts = dict(runs.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    found = _queues(user)
    queues = []
    for label, key, url in QUEUES:
        n, oldest = found.get(key, (0, None))
        queues.append((label, n, _age(oldest), url))
    return {
        "status_counts": [(s, counts.get(s, 0)) for s in RunStatus.values],
        "queues": queues,
        "per_minute": runs_per_minute(user=user),
    }


def runs_per_minute(*, user: User, minutes: int = 60) -> list[dict[str, Any]]:
    """Runs of ``user``'s tenants started and finished in each of the last ``minutes`` minutes
    (oldest first). One statement: two index range scans (created_at, finished_at), grouped by
    minute."""
    now = timezone.now().replace(second=0, microsecond=0)
    since = now - timedelta(minutes=minutes - 1)
    table = connection.ops.quote_name(WorkflowRun._meta.db_table)
    tenants = tenants_of(user)
    in_tenants = "" if tenants is None else "AND tenant = ANY(%s::varchar[])"
    scoped = [] if tenants is None else [tenants]
    with connection.cursor() as cur:
        cur.execute(
            f"""SELECT minute, sum(started), sum(finished) FROM (
                    SELECT date_trunc('minute', created_at) AS minute, 1 AS started, 0 AS finished
                      FROM {table} WHERE created_at >= %s {in_tenants}
                    UNION ALL
                    SELECT date_trunc('minute', finished_at), 0, 1 FROM {table} WHERE finished_at >= %s {in_tenants}
                ) AS moves GROUP BY minute""",
            [since, *scoped, since, *scoped],
        )
        rows = cur.fetchall()
    started = {m: int(s) for m, s, _ in rows if s}
    finished = {m: int(f) for m, _, f in rows if f}
    minutes_list = [since + timedelta(minutes=i) for i in range(minutes)]
    peak = max([*started.values(), *finished.values(), 1])
    return [
        {"minute": m, "started": started.get(m, 0), "finished": finished.get(m, 0),
         "started_pct": round(100 * started.get(m, 0) / peak), "finished_pct": round(100 * finished.get(m, 0) / peak)}
        for m in minutes_list
    ]

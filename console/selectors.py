"""Reads for the console pages. Each returns plain data or QuerySets; views only render them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import Count, Min
from django.utils import timezone

from ledger.models import EffectRecord, EffectStatus
from sagas.models import ApprovalRequest, CompensationItem, CompensationItemState, RunStatus, WorkflowRun


def _age(since: Any) -> float | None:
    return (timezone.now() - since).total_seconds() if since else None


def overview() -> dict[str, Any]:
    counts = dict(WorkflowRun.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n"))
    status_counts = [(s, counts.get(s, 0)) for s in RunStatus.values]
    attention = WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION)
    unknown = EffectRecord.objects.filter(status=EffectStatus.UNKNOWN)
    approvals = ApprovalRequest.objects.filter(state__in=["PENDING", "ESCALATED"], run__status__in=[
        RunStatus.WAITING, RunStatus.NEEDS_ATTENTION])
    failed_comp = CompensationItem.objects.filter(state__in=[CompensationItemState.FAILED, CompensationItemState.UNKNOWN])
    queues = [
        ("Unknown effects", unknown.count(), _age(unknown.aggregate(m=Min("intent_at"))["m"]), "console:effects"),
        ("Pending approvals", approvals.count(), _age(approvals.aggregate(m=Min("requested_at"))["m"]),
         "console:approvals"),
        ("Failed compensations", failed_comp.count(),
         _age(failed_comp.aggregate(m=Min("plan__created_at"))["m"]), "console:runs"),
        ("Version mismatches", attention.filter(status_reason="version_mismatch").count(),
         _age(attention.filter(status_reason="version_mismatch").aggregate(m=Min("updated_at"))["m"]),
         "console:versions"),
        ("Exhausted budgets", attention.filter(status_reason="budget_exceeded").count(),
         _age(attention.filter(status_reason="budget_exceeded").aggregate(m=Min("updated_at"))["m"]),
         "console:runs"),
    ]
    return {"status_counts": status_counts, "queues": queues, "per_minute": runs_per_minute()}


def runs_per_minute(minutes: int = 60) -> list[dict[str, Any]]:
    """Runs started and finished in each of the last ``minutes`` minutes (oldest first).
    Two index range scans (created_at, finished_at), grouped by minute."""
    now = timezone.now().replace(second=0, microsecond=0)
    since = now - timedelta(minutes=minutes - 1)
    with connection.cursor() as cur:
        cur.execute(
            """SELECT date_trunc('minute', created_at), count(*) FROM sagas_workflowrun
                WHERE created_at >= %s GROUP BY 1""", [since])
        started = dict(cur.fetchall())
        cur.execute(
            """SELECT date_trunc('minute', finished_at), count(*) FROM sagas_workflowrun
                WHERE finished_at >= %s GROUP BY 1""", [since])
        finished = dict(cur.fetchall())
    minutes_list = [since + timedelta(minutes=i) for i in range(minutes)]
    peak = max([*started.values(), *finished.values(), 1])
    return [
        {"minute": m, "started": started.get(m, 0), "finished": finished.get(m, 0),
         "started_pct": round(100 * started.get(m, 0) / peak), "finished_pct": round(100 * finished.get(m, 0) / peak)}
        for m in minutes_list
    ]

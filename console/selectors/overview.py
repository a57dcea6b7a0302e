"""Reads for the overview page: runs by status, the queues that need a person, runs per minute.

Every queue line is counted from the very queryset of the page it links to: the unknown
effects from ``effects_ambiguous`` (UNKNOWN and stuck IN_PROGRESS, as the effects queue lists
them), the approvals from ``approvals_open`` (the inbox), and each runs line from
``runs_filtered`` with the filters its link carries (NEEDS_ATTENTION and FAILED runs read once
each, grouped by ``status_reason``, and summed over the reasons a line's link filters on). So a
count and its page differ only by what changed between the two reads.

Everything is counted within the user's tenants (operators/selectors/tenancy.py). Nothing
scans the runs: runs per status and reason are kept as runs change (``sagas.integration.
run_counts``, triggers on the runs table), the oldest run of each reason is one index probe,
and the effects, approvals and paused runs come from their small partial indexes. Four queries
whatever the data: the counts, one ``UNION ALL`` of the effects', approvals' and paused runs'
counts and oldest items, the oldest runs per reason, the per-minute chart. The page is
re-rendered on every push to every open overview, so its cost is paid often.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db import connection
from django.db.models import CharField, Count, Min, QuerySet, Value
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone

from operators.selectors.queues import approvals_open, effects_ambiguous
from operators.selectors.runs import RunFilters, runs_filtered
from operators.selectors.tenancy import User, tenants_of
from sagas.integration import run_counts
from sagas.models import RunStatus, WorkflowRun

NA = RunStatus.NEEDS_ATTENTION
# Runs that stopped for a person, by the reasons the engine records (sagas/errors.py): one line
# each (key, label, the reasons it counts). The other NEEDS_ATTENTION reasons are items of the
# effects queue (effect_unknown) or the approvals inbox (approval_escalated).
RUN_QUEUES = (
    ("failed_compensations", "Failed compensations", ("compensation_failed", "compensation_unknown")),
    ("version_mismatch", "Version mismatches", ("version_mismatch",)),
    ("budget_exceeded", "Exhausted budgets", ("budget_exceeded",)),
    ("model_unavailable", "Models unavailable", ("model_unavailable",)),  # an agent's model stayed down
    ("non_determinism", "Non-deterministic runs", ("non_determinism",)),
)
# Why a FAILED run failed (WorkflowRun.status_reason, set by sagas.replay.engine), as people say it.
FAILED_REASONS = {
    "step_failed": "a step failed",
    "workflow_error": "the workflow raised an error",
    "approval_rejected": "an approval was rejected",
}
_FAILED_PREFIX = "failed:"
_NA_PREFIX = "na:"


@dataclass(frozen=True)
class QueueLine:
    """One line of "Needs a person": how many items, since when the oldest waits, and the page
    that lists exactly those items. ``sub``: a line that details the one above it."""

    key: str
    label: str
    count: int
    oldest: datetime | None
    url: str
    sub: bool = False

    @property
    def age(self) -> float | None:
        """Seconds the oldest item has waited (None: the queue is empty)."""
        return (timezone.now() - self.oldest).total_seconds() if self.oldest else None


def runs_url(*, status: str, reasons: tuple[str, ...] = ()) -> str:
    """The runs list filtered to ``status`` and (any of) ``reasons``."""
    params = {"status": status, **({"reason": ",".join(reasons)} if reasons else {})}
    return f"{reverse('console:runs')}?{urlencode(params)}"


def _counted(qs: QuerySet[Any], key: str, oldest: Any) -> QuerySet[Any]:
    """One row: ``(key, n, oldest)`` of ``qs`` (an aggregate without GROUP BY)."""
    return qs.annotate(key=Value(key, output_field=CharField())).values("key").annotate(
        n=Count("pk"), oldest=Min(oldest)).order_by()


_PREFIXES: dict[str, str] = {NA: _NA_PREFIX, RunStatus.FAILED: _FAILED_PREFIX}


def _oldest(keys: list[tuple[str, str]], tenants: list[str] | None) -> dict[tuple[str, str], datetime | None]:
    """When the oldest run of each ``(status, reason)`` got there: one probe each of the
    ``run_attention`` index (migration 0022), in one statement."""
    if not keys:
        return {}
    table = connection.ops.quote_name(WorkflowRun._meta.db_table)
    in_tenants = "" if tenants is None else "AND r.tenant = ANY(%s::varchar[])"
    with connection.cursor() as cur:
        cur.execute(
            f"""SELECT k.status, k.reason, (SELECT min(r.updated_at) FROM {table} r
                                             WHERE r.status = k.status AND r.status_reason = k.reason {in_tenants})
                  FROM unnest(%s::varchar[], %s::varchar[]) AS k(status, reason)""",
            [*([] if tenants is None else [tenants]), [s for s, _ in keys], [r for _, r in keys]],
        )
        return {(status, reason): oldest for status, reason, oldest in cur.fetchall()}


def _queues(user: User, counted: dict[tuple[str, str], int]) -> dict[str, tuple[int, datetime | None]]:
    """Every queue's size and the time its oldest item started waiting. The effects, approvals
    and paused runs in one query of their small partial indexes; the runs that need a person
    or failed, from the counts kept as runs change (``run_counts``: nothing is counted here)
    and one index probe per reason for the oldest."""
    parts = [
        _counted(effects_ambiguous(user=user), "unknown_effects", Coalesce("dispatched_at", "intent_at")),
        _counted(approvals_open(user=user), "approvals", "requested_at"),
        _counted(runs_filtered(RunFilters(paused=True), user=user), "paused_runs", "updated_at"),
    ]
    union = parts[0].union(*parts[1:], all=True)
    found = {row["key"]: (row["n"], row["oldest"]) for row in union}
    keys = [key for key in counted if key[0] in _PREFIXES]
    oldest = _oldest(keys, tenants_of(user))
    for status, reason in keys:
        found[_PREFIXES[status] + reason] = (counted[(status, reason)], oldest.get((status, reason)))
    for key, _, reasons in RUN_QUEUES:
        hits = [found[k] for k in (_NA_PREFIX + r for r in reasons) if k in found]
        olds = [oldest for _, oldest in hits if oldest]
        found[key] = (sum(n for n, _ in hits), min(olds) if olds else None)
    return found


def _failed_lines(found: dict[str, tuple[int, datetime | None]]) -> list[QueueLine]:
    """FAILED runs, then one line per reason they failed for (most first)."""
    by_reason = sorted(((k.removeprefix(_FAILED_PREFIX), n, oldest) for k, (n, oldest) in found.items()
                        if k.startswith(_FAILED_PREFIX)), key=lambda r: (-r[1], r[0]))
    olds = [oldest for _, _, oldest in by_reason if oldest]
    lines = [QueueLine("failed_runs", "Failed runs", sum(n for _, n, _ in by_reason), min(olds) if olds else None,
                       runs_url(status=RunStatus.FAILED))]
    for reason, n, oldest in by_reason:
        label = FAILED_REASONS.get(reason, reason or "no reason recorded")
        lines.append(QueueLine(f"failed_runs:{reason}", label, n, oldest,
                               runs_url(status=RunStatus.FAILED, reasons=(reason,)) if reason else
                               runs_url(status=RunStatus.FAILED), sub=True))
    return lines


def queue_lines(*, user: User, counted: dict[tuple[str, str], int] | None = None) -> list[QueueLine]:
    found = _queues(user, counted if counted is not None else run_counts(tenants=tenants_of(user)))

    def line(key: str, label: str, url: str) -> QueueLine:
        n, oldest = found.get(key, (0, None))
        return QueueLine(key, label, n, oldest, url)

    return [
        line("unknown_effects", "Unknown effects", reverse("console:effects")),
        line("approvals", "Pending approvals", reverse("console:approvals")),
        *(line(key, label, runs_url(status=NA, reasons=reasons)) for key, label, reasons in RUN_QUEUES),
        *_failed_lines(found),
        line("paused_runs", "Paused runs", f"{reverse('console:runs')}?paused=1"),
    ]


def overview(*, user: User) -> dict[str, Any]:
    counted = run_counts(tenants=tenants_of(user))
    by_status: dict[str, int] = {}
    for (status, _reason), n in counted.items():
        by_status[status] = by_status.get(status, 0) + n
    return {
        "status_counts": [(s, by_status.get(s, 0)) for s in RunStatus.values],
        "queues": queue_lines(user=user, counted=counted),
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
    return [{"minute": m, "started": started.get(m, 0), "finished": finished.get(m, 0)}
            for m in (since + timedelta(minutes=i) for i in range(minutes))]

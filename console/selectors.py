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


# --- queues, versions and the audit log (pages in console/views/queues.py and audit.py) ---------

import difflib  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from datetime import datetime  # noqa: E402
from datetime import timezone as dt_timezone  # noqa: E402

from django.db.models import Exists, OuterRef, Q, QuerySet  # noqa: E402

from console.models import AuditEntry  # noqa: E402
from ledger.connectors import Operation, get_connector  # noqa: E402
from ledger.errors import ConnectorNotRegistered  # noqa: E402
from sagas.models import (  # noqa: E402
    LEASED_STATUSES,
    OPEN_APPROVAL_STATES,
    TERMINAL_STATUSES,
    ApprovalState,
    WorkflowVersion,
)
from sagas.selectors import workers_live  # noqa: E402

PAGE_SIZE = 100


class BadCursor(ValueError):
    """A pagination cursor that was not made by ``encode_cursor``."""


_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
_MICRO = timedelta(microseconds=1)


def encode_cursor(at: datetime, pk: int) -> str:
    """``<microseconds since the epoch>_<id>``: exact, and safe in a URL as it is."""
    return f"{(at - _EPOCH) // _MICRO}_{pk}"


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    try:
        micros, pk = cursor.split("_")
        return _EPOCH + int(micros) * _MICRO, int(pk)
    except (ValueError, OverflowError) as exc:
        raise BadCursor(f"not a page cursor: {cursor[:80]!r}") from exc


@dataclass(frozen=True)
class Page:
    """One keyset page: ``items`` and the cursor of the next page (None on the last one)."""

    items: list[Any]
    next_cursor: str | None
    total: int | None  # None where counting would cost more than the page


def _keyset(qs: QuerySet, *, cursor: str | None, field_name: str, descending: bool, size: int,
            total: int | None) -> Page:
    if cursor:
        at, pk = decode_cursor(cursor)
        op = "lt" if descending else "gt"
        qs = qs.filter(Q(**{f"{field_name}__{op}": at}) | Q(**{field_name: at, f"id__{op}": pk}))
    rows = list(qs[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    next_cursor = encode_cursor(getattr(rows[-1], field_name), rows[-1].id) if more else None
    return Page(items=rows, next_cursor=next_cursor, total=total)


# Ambiguous effects ---------------------------------------------------------------------------


def effects_ambiguous() -> QuerySet[EffectRecord]:
    """Every UNKNOWN effect, and every IN_PROGRESS one whose run no worker holds a live lease
    on (stuck: nobody will settle it by itself), oldest intent first."""
    live_lease = WorkflowRun.objects.filter(
        id=OuterRef("run_id"), status__in=LEASED_STATUSES, lease_expires_at__gt=timezone.now()
    )
    return EffectRecord.objects.filter(
        Q(status=EffectStatus.UNKNOWN) | (Q(status=EffectStatus.IN_PROGRESS) & ~Exists(live_lease))
    ).order_by("intent_at", "id")


@dataclass(frozen=True)
class EffectRow:
    effect: EffectRecord
    can_lookup: bool
    connector_known: bool
    run: WorkflowRun | None

    @property
    def unknown_since(self) -> datetime:
        """When the outcome stopped being known: the last dispatch (the intent if never dispatched)."""
        return self.effect.dispatched_at or self.effect.intent_at


def _can_lookup(effect: EffectRecord) -> tuple[bool, bool]:
    try:
        return Operation(get_connector(effect.connector), effect.kind).can_lookup, True
    except (ConnectorNotRegistered, ValueError):
        return False, False


EFFECTS_PAGE_SIZE = 50  # each row carries its resolve form; 100 rows rendered in ~110 ms


def effects_ambiguous_page(*, cursor: str | None = None, size: int = EFFECTS_PAGE_SIZE) -> Page:
    qs = effects_ambiguous()
    page = _keyset(qs, cursor=cursor, field_name="intent_at", descending=False, size=size, total=qs.count())
    runs = WorkflowRun.objects.in_bulk({e.run_id for e in page.items})
    rows = []
    for effect in page.items:
        can_lookup, known = _can_lookup(effect)
        rows.append(EffectRow(effect=effect, can_lookup=can_lookup, connector_known=known, run=runs.get(effect.run_id)))
    return Page(items=rows, next_cursor=page.next_cursor, total=page.total)


def effect_current_outcome(effect_id: int) -> str:
    """What happened to an effect, for a refused action: who resolved it and when."""
    effect = EffectRecord.objects.filter(id=effect_id).first()
    if effect is None:
        return ""
    if effect.resolved_at:
        return (f"already resolved by {effect.resolved_by_label} at {effect.resolved_at:%Y-%m-%d %H:%M:%S} UTC "
                f"({effect.resolution}: {effect.status})")
    if effect.is_settled:
        return f"its outcome is already known: {effect.status}"
    return ""


# Approvals ----------------------------------------------------------------------------------

INBOX_LIMIT = 100  # rendering dominates: 500 rows cost ~0.7 s at a million runs


def approvals_open() -> QuerySet[ApprovalRequest]:
    """Undecided approvals (PENDING, or ESCALATED past their deadline) of runs that still wait
    for them, soonest deadline first."""
    return (
        ApprovalRequest.objects.filter(
            state__in=OPEN_APPROVAL_STATES, run__status__in=[RunStatus.WAITING, RunStatus.NEEDS_ATTENTION]
        )
        .select_related("run", "run__started_by")
        .order_by("deadline", "id")
    )


def approvals_recently_decided(limit: int = 20) -> QuerySet[ApprovalRequest]:
    return (
        ApprovalRequest.objects.filter(decided_at__isnull=False)
        .exclude(state__in=OPEN_APPROVAL_STATES)
        .select_related("run")
        .order_by("-decided_at", "-id")[:limit]
    )


def approval_current_decision(approval_id: int) -> str:
    """Who decided an approval and when, for a refused action."""
    approval = ApprovalRequest.objects.filter(id=approval_id).first()
    if approval is None or approval.state in OPEN_APPROVAL_STATES:
        return ""
    if approval.state == ApprovalState.EXPIRED or not approval.decided_at:
        return f"it is {approval.state.lower()}: its deadline passed"
    return (f"already {approval.state.lower()} by {approval.decided_by_label} at "
            f"{approval.decided_at:%Y-%m-%d %H:%M:%S} UTC")


# Versions -----------------------------------------------------------------------------------


@dataclass
class HashRow:
    definition_hash: str
    record: WorkflowVersion | None  # None: runs use a hash no process has registered here
    in_flight: int = 0
    workers: list[str] = field(default_factory=list)


@dataclass
class VersionRow:
    version: int
    hashes: list[HashRow] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return sum(h.in_flight for h in self.hashes)


@dataclass
class WorkflowRow:
    name: str
    versions: list[VersionRow] = field(default_factory=list)
    records: list[WorkflowVersion] = field(default_factory=list)  # for the diff pickers, newest first


def versions_overview() -> list[WorkflowRow]:
    """Every workflow, its versions and their hashes, with runs in flight per (version, hash)
    and the live workers that run each hash. Runs on a hash with no WorkflowVersion row are
    listed too (record None), so nothing in flight is invisible."""
    in_flight: dict[tuple[str, int, str], int] = {
        (name, version, h): n
        for name, version, h, n in WorkflowRun.objects.exclude(status__in=TERMINAL_STATUSES)
        .values_list("workflow_name", "version", "definition_hash")
        .annotate(n=Count("id"))
        .values_list("workflow_name", "version", "definition_hash", "n")
    }
    workers: dict[tuple[str, int, str], list[str]] = {}
    for name, definitions in workers_live().values_list("name", "definitions"):
        for d in definitions or []:
            try:
                key = (d["name"], int(d["version"]), d["hash"])
            except (KeyError, TypeError, ValueError):
                continue
            workers.setdefault(key, []).append(name)

    hashes: dict[tuple[str, int, str], HashRow] = {}
    records: dict[str, list[WorkflowVersion]] = {}
    for record in WorkflowVersion.objects.order_by("name", "-version", "-last_registered_at", "id"):
        key = (record.name, record.version, record.definition_hash)
        hashes[key] = HashRow(definition_hash=record.definition_hash, record=record)
        records.setdefault(record.name, []).append(record)
    for key in in_flight:
        hashes.setdefault(key, HashRow(definition_hash=key[2], record=None))
    for key, row in hashes.items():
        row.in_flight = in_flight.get(key, 0)
        row.workers = sorted(workers.get(key, []))

    workflows: dict[str, WorkflowRow] = {}
    for (name, version, _h), row in sorted(hashes.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        wf = workflows.setdefault(name, WorkflowRow(name=name, records=records.get(name, [])))
        if not wf.versions or wf.versions[-1].version != version:
            wf.versions.append(VersionRow(version=version))
        wf.versions[-1].hashes.append(row)
    return list(workflows.values())


def runs_stranded(limit: int = 200) -> QuerySet[WorkflowRun]:
    """Runs parked because no live worker has their code (version_mismatch), oldest first."""
    return WorkflowRun.objects.filter(
        status=RunStatus.NEEDS_ATTENTION, status_reason="version_mismatch"
    ).order_by("updated_at", "id")[:limit]


def runs_stranded_count() -> int:
    return WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION, status_reason="version_mismatch").count()


@dataclass(frozen=True)
class DiffLine:
    kind: str  # "file", "hunk", "added", "removed", "context"
    text: str


def version_diff(a: WorkflowVersion, b: WorkflowVersion, *, context: int = 3) -> list[DiffLine]:
    """Unified diff of two registered sources (a -> b), line by line with its kind. Plain text:
    the template escapes it."""
    def label(v: WorkflowVersion) -> str:
        return f"{v.name} v{v.version} {v.definition_hash[:12]}"

    lines = []
    for text in difflib.unified_diff(
        a.source.splitlines(), b.source.splitlines(), fromfile=label(a), tofile=label(b), lineterm="", n=context
    ):
        if text.startswith(("+++", "---")):
            kind = "file"
        elif text.startswith("@@"):
            kind = "hunk"
        elif text.startswith("+"):
            kind = "added"
        elif text.startswith("-"):
            kind = "removed"
        else:
            kind = "context"
        lines.append(DiffLine(kind=kind, text=text))
    return lines


# Audit log ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditFilters:
    actor: str = ""
    action: str = ""
    object_type: str = ""
    object_id: str = ""
    outcome: str = ""
    since: datetime | None = None
    until: datetime | None = None


def audit_entries(filters: AuditFilters) -> QuerySet[AuditEntry]:
    """Audit entries matching every given filter, newest first (created_at desc, id desc)."""
    qs = AuditEntry.objects.all()
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
    return qs.order_by("-created_at", "-id")


AUDIT_PAGE_SIZE = 50  # each entry renders its before/after payloads; 100 put the p95 over 100 ms at scale


def audit_page(filters: AuditFilters, *, cursor: str | None = None, size: int = AUDIT_PAGE_SIZE) -> Page:
    qs = audit_entries(filters)
    return _keyset(qs, cursor=cursor, field_name="created_at", descending=True, size=size, total=None)


def audit_known_values() -> dict[str, list[str]]:
    """Suggestions for the filter pickers (free text is accepted too). Taken from the roles
    table rather than the log, which would need a scan of the whole table."""
    from console.roles import ACTION_ROLES

    actions = sorted(ACTION_ROLES)
    return {"actions": actions, "object_types": sorted({a.split(".", 1)[0] for a in actions})}


# --- runs list and run detail (pages in console/views/runs.py) ---------------------------------

import re  # noqa: E402
import uuid as uuid_lib  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import datetime  # noqa: E402
from datetime import timezone as dt_timezone  # noqa: E402

from django.db.models import BooleanField  # noqa: E402
from django.db.models.expressions import RawSQL  # noqa: E402

from sagas.models import CompensationPlan, JournalEntry  # noqa: E402

RUNS_PAGE_SIZE = 50
HISTORY_PAGE_SIZE = 100
HISTORY_EXPORT_BATCH = 1000
RUN_EFFECTS_LIMIT = 200


@dataclass(frozen=True)
class RunFilters:
    """The runs list's filters, already parsed. Empty values filter nothing.

    ``search`` matches a run id or a business key: a whole UUID matches that run (or a business
    key spelled exactly like it); a run id prefix (hex digits, as the list shows them) matches
    runs whose id starts with it; anything else matches business keys that start with it (which
    includes the exact key).
    """

    status: str = ""
    workflow: str = ""
    version: int | None = None
    tenant: str = ""
    created_from: datetime | None = None  # inclusive
    created_to: datetime | None = None  # exclusive
    search: str = ""


_HEX_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")


def _run_id_range(prefix: str) -> tuple[uuid_lib.UUID, uuid_lib.UUID] | None:
    """The range of run ids starting with ``prefix`` (hex digits, dashes ignored): PostgreSQL
    orders uuids byte by byte, so this is a range scan of the primary key."""
    digits = prefix.replace("-", "").lower()
    if not _HEX_PREFIX.match(digits):
        return None
    return uuid_lib.UUID(digits.ljust(32, "0")), uuid_lib.UUID(digits.ljust(32, "f"))


def runs_filtered(filters: RunFilters) -> QuerySet[WorkflowRun]:
    """Runs matching ``filters``, newest first (``created_at`` desc, ``id`` desc).

    Every filter is an equality or a range that one of the ``run_*_created`` indexes (sagas
    migration 0006) serves in this order, so a page reads about a page of index entries.
    """
    qs = WorkflowRun.objects.all()
    if filters.status:
        qs = qs.filter(status=filters.status)
    if filters.workflow:
        qs = qs.filter(workflow_name=filters.workflow)
        if filters.version is not None:
            qs = qs.filter(version=filters.version)
    if filters.tenant:
        qs = qs.filter(tenant=filters.tenant)
    if filters.created_from is not None:
        qs = qs.filter(created_at__gte=filters.created_from)
    if filters.created_to is not None:
        qs = qs.filter(created_at__lt=filters.created_to)
    if filters.search:
        term = filters.search
        try:
            run_id = uuid_lib.UUID(term)
        except ValueError:
            id_range = _run_id_range(term)
            match = Q(business_key__startswith=term)
            if id_range is not None:
                match |= Q(id__range=id_range)
        else:
            match = Q(id=run_id) | Q(business_key=term)
        qs = qs.filter(match)
    return qs.order_by("-created_at", "-id")


class BadRunCursor(ValueError):
    """A runs page cursor that was not made by ``encode_run_cursor``."""


@dataclass(frozen=True)
class RunsPage:
    """One keyset page of runs and the cursor of the next page (None on the last one)."""

    items: list[WorkflowRun]
    next_cursor: str | None


_RUN_EPOCH = datetime(1970, 1, 1, tzinfo=dt_timezone.utc)
_RUN_MICRO = timedelta(microseconds=1)
RunCursor = tuple[datetime, uuid_lib.UUID]


def encode_run_cursor(at: datetime, run_id: uuid_lib.UUID) -> str:
    """``<microseconds since the epoch>_<run id hex>``: exact, and safe in a URL as it is."""
    return f"{(at - _RUN_EPOCH) // _RUN_MICRO}_{run_id.hex}"


def decode_run_cursor(cursor: str) -> RunCursor:
    try:
        micros, run_id = cursor.split("_")
        return _RUN_EPOCH + int(micros) * _RUN_MICRO, uuid_lib.UUID(hex=run_id)
    except (ValueError, OverflowError) as exc:
        raise BadRunCursor(f"not a runs page cursor: {cursor[:80]!r}") from exc


def runs_page(filters: RunFilters, *, cursor: str | None = None, size: int = RUNS_PAGE_SIZE) -> RunsPage:
    """One keyset page of ``runs_filtered``: the rows after ``cursor`` and the next cursor.

    The cursor is compared as a row, ``(created_at, id) < (%s, %s)``, which PostgreSQL uses as
    an index condition: page 1000 costs what page 1 costs. No OFFSET and no COUNT. Raises
    ``BadRunCursor`` for a cursor that ``encode_run_cursor`` did not make.
    """
    qs = runs_filtered(filters).defer("input", "result", "error")
    if cursor:
        at, run_id = decode_run_cursor(cursor)
        qs = qs.filter(
            RawSQL(
                '("sagas_workflowrun"."created_at", "sagas_workflowrun"."id") < (%s, %s)',
                (at, run_id), output_field=BooleanField(),
            )
        )
    rows = list(qs[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    next_cursor = encode_run_cursor(rows[-1].created_at, rows[-1].id) if more else None
    return RunsPage(items=rows, next_cursor=next_cursor)


def workflow_names() -> list[str]:
    """Names for the workflow filter's suggestions (the versions table, not the runs)."""
    return list(WorkflowVersion.objects.order_by("name").values_list("name", flat=True).distinct())


@dataclass(frozen=True)
class HistoryPage:
    """Journal entries newest first, and the seq to continue below (None: nothing older)."""

    entries: list[JournalEntry]
    next_before: int | None


def run_history_page(run_id: Any, *, before: int | None = None, size: int = HISTORY_PAGE_SIZE) -> HistoryPage:
    """The ``size`` newest entries with ``seq < before``: one backward range scan of the
    ``(run_id, seq)`` unique index, whatever the length of the history."""
    qs = JournalEntry.objects.filter(run_id=run_id)
    if before is not None:
        qs = qs.filter(seq__lt=before)
    rows = list(qs.order_by("-seq")[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return HistoryPage(entries=rows, next_before=rows[-1].seq if more and rows else None)


def run_history_since(run_id: Any, *, after: int, size: int = HISTORY_PAGE_SIZE) -> tuple[list[JournalEntry], int]:
    """Entries with ``seq > after`` (newest first, at most ``size``) and how many there are in
    all. Counting reads only the new part of the ``(run_id, seq)`` index."""
    qs = JournalEntry.objects.filter(run_id=run_id, seq__gt=after)
    rows = list(qs.order_by("-seq")[: size + 1])
    total = len(rows) if len(rows) <= size else qs.count()
    return rows[:size], total


def run_history_batches(run_id: Any, *, batch: int = HISTORY_EXPORT_BATCH) -> Iterator[list[dict[str, Any]]]:
    """The whole journal of a run, oldest first, in batches of plain dicts (keyset on seq, so
    memory stays at one batch however long the history)."""
    after = 0
    fields = ("seq", "created_at", "kind", "name", "worker_id", "payload")
    while True:
        rows = list(
            JournalEntry.objects.filter(run_id=run_id, seq__gt=after).order_by("seq").values(*fields)[:batch]
        )
        if not rows:
            return
        yield rows
        if len(rows) < batch:
            return
        after = rows[-1]["seq"]


def run_effects(run_id: Any, *, limit: int = RUN_EFFECTS_LIMIT) -> tuple[list[EffectRecord], bool]:
    """The run's ledger records (forward effects and compensations), in the order their intents
    were recorded; at most ``limit``, and whether there are more."""
    rows = list(
        EffectRecord.objects.filter(run_id=run_id)
        .defer("request_payload", "result")
        .order_by("intent_at", "id")[: limit + 1]
    )
    return rows[:limit], len(rows) > limit


def run_approvals(run_id: Any) -> QuerySet[ApprovalRequest]:
    return ApprovalRequest.objects.filter(run_id=run_id).order_by("requested_at", "id")


def run_compensation(run_id: Any) -> CompensationPlan | None:
    """The run's compensation plan with its items prefetched (``plan.item_list``), or None."""
    plan = CompensationPlan.objects.filter(run_id=run_id).first()
    if plan is not None:
        plan.item_list = list(plan.items.order_by("position"))
    return plan

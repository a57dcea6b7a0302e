"""Reads for the queues people work through: ambiguous effects and the approvals inbox, each
narrowed to the user's tenants (operators/selectors/tenancy.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import EmptyResultSet
from django.db import connection
from django.db.models import CharField, Exists, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Coalesce, Concat
from django.utils import timezone

from ledger.connectors import Operation, get_connector
from ledger.errors import ConnectorNotRegistered
from ledger.models import EffectRecord, EffectStatus
from operators.selectors.paging import Cursor, Page, keyset_page
from operators.selectors.search import effects_matching
from operators.selectors.tenancy import User, scope
from sagas.models import (
    LEASED_STATUSES,
    OPEN_APPROVAL_STATES,
    ApprovalRequest,
    ApprovalState,
    WorkflowRun,
)

EFFECTS_PAGE_SIZE = 50  # each row carries its resolve form; 100 rows rendered in ~110 ms
INBOX_LIMIT = 50  # a page of the approvals inbox, as many rows as the run list and the effects queue


# --- ambiguous effects ---------------------------------------------------------------------


@dataclass(frozen=True)
class EffectFilters:
    """The queue's filters, already validated (console.forms_queues.EffectFilterForm). Empty
    values filter nothing. ``older_than``: unknown (since the last dispatch) for at least this
    long. ``search``: a business key substring or a run id or its first hex digits
    (operators/selectors/search.py)."""

    connector: str = ""
    workflow: str = ""
    tenant: str = ""
    older_than: timedelta | None = None
    search: str = ""

    @property
    def any(self) -> bool:
        return bool(self.connector or self.workflow or self.tenant or self.older_than or self.search)


NO_FILTERS = EffectFilters()


def effects_ambiguous(*, user: User, filters: EffectFilters = NO_FILTERS) -> QuerySet[EffectRecord]:
    """Every UNKNOWN effect, and every IN_PROGRESS one whose run no worker holds a live lease
    on (stuck: nobody will settle it by itself), of ``user``'s tenants, matching ``filters``,
    oldest intent first. The filters narrow the open effects (a partial index keeps them
    apart from the settled millions, and carries each one's workflow and business key, copied
    from its run when it was recorded): no filter looks up an effect's run."""
    now = timezone.now()
    live_lease = WorkflowRun.objects.filter(
        id=OuterRef("run_id"), status__in=LEASED_STATUSES, lease_expires_at__gt=now
    )
    # The tenant is tested through an expression no index serves: otherwise PostgreSQL combines
    # the open effects' partial index with the tenant's entries in effect_unique_tenant_key,
    # which grow with every effect the ledger ever recorded (151,469 for one tenant at 10M runs:
    # 23 ms), where the open effects are the backlog alone.
    open_effects = EffectRecord.objects.alias(
        open_tenant=Concat("tenant", Value(""), output_field=CharField())
    ).filter(Q(status=EffectStatus.UNKNOWN) | (Q(status=EffectStatus.IN_PROGRESS) & ~Exists(live_lease)))
    qs = scope(open_effects, user, field="open_tenant")
    if filters.connector:
        qs = qs.filter(connector=filters.connector)
    if filters.tenant:
        qs = qs.filter(Q(open_tenant=filters.tenant))  # Q: mypy's Django plugin knows no alias
    if filters.older_than is not None:
        qs = qs.alias(unknown_since=Coalesce("dispatched_at", "intent_at")).filter(
            unknown_since__lte=now - filters.older_than)
    if filters.workflow:
        qs = qs.filter(workflow_name=filters.workflow)
    if filters.search:
        qs = qs.filter(effects_matching(filters.search))
    return qs.order_by("intent_at", "id")


# Each connector that has an open effect, one probe of effect_open_connector each (a loose index
# scan; the index is in the "C" collation, key and predicate, which no other query says: ledger
# migration 0005); then those of which ``user`` sees an open effect ({seen}: that queryset), a
# probe each too.
_OPEN = """status COLLATE "C" IN ('UNKNOWN', 'IN_PROGRESS')"""
_OPEN_CONNECTORS_SQL = f"""
WITH RECURSIVE walk(connector) AS (
    (SELECT connector COLLATE "C" FROM ledger_effectrecord
      WHERE {_OPEN} ORDER BY connector COLLATE "C" LIMIT 1)
    UNION ALL
    SELECT (SELECT e.connector COLLATE "C" FROM ledger_effectrecord e
             WHERE {_OPEN} AND e.connector COLLATE "C" > walk.connector
             ORDER BY e.connector COLLATE "C" LIMIT 1)
      FROM walk WHERE walk.connector IS NOT NULL
)
SELECT walk.connector FROM walk
 CROSS JOIN LATERAL (SELECT 1 FROM ({{seen}}) seen
                      WHERE seen.connector COLLATE "C" = walk.connector AND seen.{_OPEN} LIMIT 1) hit
 WHERE walk.connector IS NOT NULL
"""


def effect_connectors(*, user: User) -> list[str]:
    """The connectors of the open effects ``user`` sees, for the queue's connector filter, in
    one query that costs a probe per connector, not a pass over the backlog."""
    try:
        seen, params = effects_ambiguous(user=user).order_by().values("connector", "status").query.sql_with_params()
    except EmptyResultSet:  # a user of no tenant sees no effect
        return []
    with connection.cursor() as cur:
        cur.execute(_OPEN_CONNECTORS_SQL.replace("{seen}", seen), params)
        return sorted(connector for (connector,) in cur.fetchall())


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


def effects_ambiguous_page(*, user: User, filters: EffectFilters = NO_FILTERS, cursor: Cursor | None = None,
                           size: int = EFFECTS_PAGE_SIZE) -> Page[EffectRow]:
    """One keyset page of ``effects_ambiguous`` (with how many match in all), each effect with
    its run (business key, tenant, summary; not its input) and whether its connector can be
    asked."""
    qs = effects_ambiguous(user=user, filters=filters)
    if filters.search:
        page = _one_pass_page(qs, cursor=cursor, size=size)
    else:
        page = _positions_page(qs, cursor=cursor, size=size)
    runs = WorkflowRun.objects.defer("input", "result", "error").in_bulk({e.run_id for e in page.items})
    rows = []
    for effect in page.items:
        can_lookup, known = _can_lookup(effect)
        rows.append(EffectRow(effect=effect, can_lookup=can_lookup, connector_known=known, run=runs.get(effect.run_id)))
    return Page(items=rows, next=page.next, total=page.total)


def _positions_page(qs: QuerySet[EffectRecord], *, cursor: Cursor | None, size: int) -> Page[EffectRecord]:
    """A page and the count of every match, both read from the open effects' partial index
    alone (``effect_open_context``, whose included columns every filter but the search tests):
    the page's positions, ``(intent_at, id)``, in the index's order, then its rows by primary
    key. Asking for whole rows let PostgreSQL, which guesses a workflow + tenant filter matches
    13 of 20,000 open effects (315 do), fetch every open effect's row and sort them: 12.6 ms at
    10,000,000 runs, against 0.9 ms for the positions."""
    page = keyset_page(qs.only("id", "intent_at"), field="intent_at", descending=False, cursor=cursor, size=size,
                       total=qs.count())
    return Page(items=_open_rows([effect.pk for effect in page.items]), next=page.next, total=page.total)


def _one_pass_page(qs: QuerySet[EffectRecord], *, cursor: Cursor | None, size: int) -> Page[EffectRecord]:
    """A page and the count of every match from one pass over the open effects, for a search
    (a pattern tested on every open effect's business key): counting and then paging tested
    each key twice. The pass reads only the position of each match, ``(intent_at, id)``; the
    page's rows are then read by primary key."""
    keys = list(qs.order_by("intent_at", "id").values_list("intent_at", "id"))
    after = keys if cursor is None else [k for k in keys if k > (cursor.at, cursor.pk)]
    shown = after[:size]
    more = len(after) > size
    return Page(items=_open_rows([pk for _at, pk in shown]), next=Cursor(at=shown[-1][0], pk=shown[-1][1]) if more
                else None, total=len(keys))


def _open_rows(ids: list[int]) -> list[EffectRecord]:
    """The effects ``ids`` in that order, those still open: one settled between reading the
    page's positions and its rows is left out of the page (the next page starts after it all
    the same)."""
    found = EffectRecord.objects.filter(status__in=[EffectStatus.UNKNOWN, EffectStatus.IN_PROGRESS]).in_bulk(ids)
    return [found[pk] for pk in ids if pk in found]


def effect_get(effect_id: int) -> EffectRecord | None:
    return EffectRecord.objects.filter(id=effect_id).first()


def effect_current_outcome(effect_id: int) -> str:
    """What happened to an effect, for a refused action: who resolved it and when."""
    effect = effect_get(effect_id)
    if effect is None:
        return ""
    if effect.resolved_at:
        return (f"already resolved by {effect.resolved_by_label} at {effect.resolved_at:%Y-%m-%d %H:%M:%S} UTC "
                f"({effect.resolution}: {effect.status})")
    if effect.is_settled:
        return f"its outcome is already known: {effect.status}"
    return ""


# --- approvals -----------------------------------------------------------------------------


def _undecided(user: User) -> QuerySet[ApprovalRequest]:
    return (
        scope(ApprovalRequest.objects.filter(state__in=OPEN_APPROVAL_STATES), user, field="run__tenant")
        .select_related("run", "run__started_by")
        .defer("run__input", "run__result", "run__error")
        .order_by("deadline", "id")
    )


def approvals_open(*, user: User) -> QuerySet[ApprovalRequest]:
    """Undecided approvals (PENDING, or ESCALATED past their deadline) of runs of ``user``'s
    tenants that wait for them (WAITING or NEEDS_ATTENTION, ``run_waits``: kept on the approval
    by triggers, ``sagas.store.approval_waits``), soonest deadline first. Read from the partial
    index ``approval_waiting_deadline``: no open approval is joined to its run to be counted."""
    return _undecided(user).filter(run_waits=True)


def approvals_inbox(*, user: User, limit: int = INBOX_LIMIT, cursor: Cursor | None = None) -> Page[ApprovalRequest]:
    """A page of ``approvals_open``: the first ``limit`` after ``cursor`` (a ``(deadline, id)``
    position; None: the soonest deadlines), the next page's position, and how many are open in
    all (counted only when there is more than one page)."""
    qs = approvals_open(user=user)
    page = keyset_page(qs, field="deadline", descending=False, cursor=cursor, size=limit)
    total = len(page.items) if cursor is None and page.next is None else qs.count()
    return Page(items=page.items, next=page.next, total=total)


def approvals_recently_decided(*, user: User, limit: int = 20) -> list[ApprovalRequest]:
    return list(
        scope(ApprovalRequest.objects.filter(decided_at__isnull=False), user, field="run__tenant")
        .exclude(state__in=OPEN_APPROVAL_STATES)
        .select_related("run")
        .defer("run__input", "run__result", "run__error")
        .order_by("-decided_at", "-id")[:limit]
    )


def approval_get(approval_id: int) -> ApprovalRequest | None:
    return ApprovalRequest.objects.filter(id=approval_id).first()


def approval_current_decision(approval_id: int) -> str:
    """Who decided an approval and when, for a refused action."""
    approval = approval_get(approval_id)
    if approval is None or approval.state in OPEN_APPROVAL_STATES:
        return ""
    if approval.state == ApprovalState.EXPIRED or not approval.decided_at:
        return f"it is {approval.state.lower()}: its deadline passed"
    return (f"already {approval.state.lower()} by {approval.decided_by_label} at "
            f"{approval.decided_at:%Y-%m-%d %H:%M:%S} UTC")

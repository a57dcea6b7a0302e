"""Reads for the runs list and a run's page (header, history, effects, approvals, compensation).

The list and ``run_get`` take the user and see only the user's tenants
(operators/selectors/tenancy.py); the reads of one run's parts take a run already got that way.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, Q, QuerySet

from ledger.models import EffectRecord
from operators.selectors.paging import Cursor, Page, keyset_page
from operators.selectors.search import runs_matching
from operators.selectors.tenancy import User, scope, scope_runs
from sagas.integration import chain_place
from sagas.models import (
    REPAIR_KINDS,
    TERMINAL_STATUSES,
    ApprovalRequest,
    ArchivedRun,
    CompensationItem,
    CompensationPlan,
    JournalEntry,
    RunStatus,
    WorkflowPause,
    WorkflowRun,
    WorkflowVersion,
)

RUNS_PAGE_SIZE = 50
HISTORY_PAGE_SIZE = 100
HISTORY_EXPORT_BATCH = 1000
RUN_EFFECTS_LIMIT = 200


# --- the runs list ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFilters:
    """The runs list's filters, already validated (console.forms.RunFilterForm). Empty values
    filter nothing.

    ``search`` matches a run id or a business key (operators/selectors/search.py): a whole UUID
    matches that run (or a business key spelled exactly like it); a run id prefix (hex digits,
    as the list shows them) matches runs whose id starts with it; any term matches business keys
    that contain it, ignoring case.
    """

    status: str = ""
    workflow: str = ""
    version: int | None = None
    tenant: str = ""
    created_from: datetime | None = None  # inclusive
    created_to: datetime | None = None  # exclusive
    search: str = ""
    reasons: tuple[str, ...] = ()  # any of these status_reasons (the overview's queue lines)
    paused: bool = False  # only unfinished runs held by a pause (sagas.pausing)
    top_level: bool = False  # only runs no run started as its child (``parent_run`` is null)
    parent: str = ""  # only the children of this run (a canonical run id; sagas.children)


UNFINISHED = [s for s in RunStatus.values if s not in TERMINAL_STATUSES]


def _paused_now() -> Q:
    """``sagas.models.paused_runs`` with the workflow pauses of this moment spelled out (there
    are few): each term is an index range (the ``run_paused`` partial index, the workflow
    index), where the ``EXISTS`` form made PostgreSQL test every run of the table."""
    held = Q(paused_at__isnull=False)
    for name, version in WorkflowPause.objects.values_list("workflow_name", "version"):
        held |= Q(workflow_name=name) if version is None else Q(workflow_name=name, version=version)
    return held


def runs_filtered(filters: RunFilters, *, user: User) -> QuerySet[WorkflowRun]:
    """Runs of ``user``'s tenants matching ``filters`` (unordered: ``runs_page`` orders them,
    newest first). The tenant filter narrows within the user's tenants, never beyond them.

    Every filter is an equality or a range that one of the ``run_*_created`` indexes (sagas
    migration 0006) serves in the list's order, so a page reads about a page of index entries;
    the business-key search is a lookup of the key-pieces index (sagas migration 0029). A
    parent's children are a range of the ``run_children`` index (migration 0034), and the
    top-level runs alone are the ``run_top_level`` index (migration 0035).
    """
    qs = scope_runs(WorkflowRun.objects.all(), user)
    if filters.status:
        qs = qs.filter(status=filters.status)
    if filters.workflow:
        qs = qs.filter(workflow_name=filters.workflow)
        if filters.version is not None:
            qs = qs.filter(version=filters.version)
    if filters.tenant:
        qs = qs.filter(tenant=filters.tenant)
    if filters.reasons:
        qs = qs.filter(status_reason__in=filters.reasons)
    if filters.paused:
        qs = qs.filter(_paused_now()).filter(status__in=UNFINISHED)
    if filters.top_level:
        qs = qs.filter(parent_run__isnull=True)
    if filters.parent:
        qs = qs.filter(parent_run=filters.parent)
    if filters.created_from is not None:
        qs = qs.filter(created_at__gte=filters.created_from)
    if filters.created_to is not None:
        qs = qs.filter(created_at__lt=filters.created_to)
    if filters.search:
        qs = qs.filter(runs_matching(filters.search))
    return qs


NOT_LISTED = ("input", "result", "error")  # a run's columns the list never shows: not read for it


def runs_page(filters: RunFilters, *, user: User, cursor: Cursor | None = None,
              size: int = RUNS_PAGE_SIZE) -> Page[WorkflowRun]:
    """One keyset page of ``runs_filtered``, newest first (``created_at`` desc, ``id`` desc).
    No COUNT, and no OFFSET into the results: page 1000 costs what page 1 costs (a search
    expected to match many runs skips ``WALK_ROWS`` entries of the created index, only to
    bound its walk)."""
    qs = runs_filtered(filters, user=user).defer(*NOT_LISTED)
    if not filters.search:
        return keyset_page(qs, field="created_at", descending=True, cursor=cursor, size=size)
    if _few(qs):
        return _sorted_page(qs, cursor=cursor, size=size)
    # Many matches expected: walk the runs newest first and test each one's key, which finds a
    # page of dense matches at once whatever the table's size (left to itself, PostgreSQL
    # switches to reading every match through its index as the table grows: 131 ms of
    # SQL for q=0012 at 10,000,000 runs). The estimate can be wrong by far: a key's start
    # (KYC-0001*, and a term of one or two characters) is a range of the upper(business_key)
    # b-tree, estimated from a histogram whose every bucket holds 1 % of the runs (1,250
    # matches estimated at 101,011 at 10,000,000 runs). So the walk goes no further than the
    # next WALK_ROWS runs: a page not filled there is found through the index and sorted after
    # all (left to itself, PostgreSQL walked on through all ten million runs for KYC-0001*,
    # whose matches are among the oldest: 1.8 s).
    unsearched = runs_filtered(replace(filters, search=""), user=user)
    after = unsearched if cursor is None else unsearched.filter(
        Q(created_at__lt=cursor.at) | Q(created_at=cursor.at, pk__lt=cursor.pk))
    floor = after.order_by("-created_at", "-pk").values_list("created_at", flat=True)[WALK_ROWS:WALK_ROWS + 1].first()
    walk = unsearched.filter(runs_matching(filters.search, walk=True))
    if floor is not None:
        walk = walk.filter(created_at__gte=floor)
    page = keyset_page(walk.defer(*NOT_LISTED), field="created_at", descending=True, cursor=cursor,
                       size=size)
    if page.next is None and floor is not None:  # not a page within the walk's reach
        return _sorted_page(qs, cursor=cursor, size=size)
    return page


def _sorted_page(qs: QuerySet[WorkflowRun], *, cursor: Cursor | None, size: int) -> Page[WorkflowRun]:
    """A page of a search's matches found through its index and sorted: the sort carries each
    match's position only (``created_at``, ``id``), and the page's rows are then read by primary
    key, without the search's conditions (the positions came from ``qs``, the user's tenants
    included). Sorting whole rows carried every column of every match through the sort: 8.7 of
    17.3 ms for the 11,314 matches of ``0012`` at a million runs. A run gone meanwhile (archived)
    is left out of the page; the next page starts after it all the same."""
    page = keyset_page(qs.only("id", "created_at"), field="created_at", descending=True, cursor=cursor, size=size,
                       sort=True)
    rows = WorkflowRun.objects.defer(*NOT_LISTED).in_bulk([run.pk for run in page.items])
    return Page(items=[rows[run.pk] for run in page.items if run.pk in rows], next=page.next, total=page.total)


WALK_ROWS = 2_000  # runs a dense search walks before it falls back to its index (a page at >= 2.5 % density)


SORTED_MATCHES = 5_000  # a search expected to match at most this many sorts them (keyset_page's ``sort``)


def _few(qs: QuerySet[WorkflowRun]) -> bool:
    """Whether PostgreSQL expects a search to match at most ``SORTED_MATCHES`` runs: then its
    matches are found through their own index and sorted (14 ms for 1,250); with more, they
    are dense and walking the runs newest first finds a page of them at once. The planner's
    estimate (EXPLAIN, nothing executed: under 2 ms) is within a factor of two of the truth for
    business-key searches, where counting, even stopped at a cap, cost 13 to 73 ms."""
    sql, params = qs.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cur.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    return float(plan[0]["Plan"]["Plan Rows"]) <= SORTED_MATCHES


def workflow_names() -> list[str]:
    """Names for the workflow filter's suggestions (the versions table, not the runs)."""
    return list(WorkflowVersion.objects.order_by("name").values_list("name", flat=True).distinct())


# --- one run -------------------------------------------------------------------------------


def run_get(run_id: Any, *, user: User) -> WorkflowRun | None:
    """The run (with who started it), or None for an unknown or malformed id or a run outside
    ``user``'s tenants. ``run.chain`` is its ``RunChain`` (None if it is in none)."""
    try:
        run = scope_runs(WorkflowRun.objects.select_related("started_by"), user).filter(id=run_id).first()
    except (ValidationError, ValueError, TypeError):
        return None
    if run is not None:
        run.chain = run_chain(run)  # type: ignore[attr-defined]  # for the template, not a field
    return run


# Links followed to find a chain's newest run: past this many the page says "at least".
CHAIN_WALK_LIMIT = 10_000


@dataclass(frozen=True)
class RunChain:
    """A run's place in a chain of runs linked by ``ctx.continue_as_new``."""

    position: int  # 1 for the chain's first run
    length: int  # runs up to the newest (at least, when ``length_capped``)
    length_capped: bool
    first_id: str
    business_key: str  # the chain's: its first run's (later runs have "<key>#<position>")
    previous_id: str | None
    next_id: str | None
    newest_id: str


def run_chain(run: WorkflowRun) -> RunChain | None:
    """Where ``run`` stands in its chain, or None for a run that neither continues nor was
    continued (no query then). The position and first run come from the run's ``started``
    entry (so they survive retention archiving older runs); the newest run is found by
    following ``continued_to`` by primary key, in one recursive query."""
    if run.continued_from is None and run.continued_to is None:
        return None
    place = chain_place(run.id, business_key=run.business_key)
    newest, after = str(run.id), 0
    if run.continued_to is not None:
        with connection.cursor() as cur:
            cur.execute(
                """WITH RECURSIVE later(id, next, n) AS (
                       SELECT id, continued_to, 1 FROM sagas_workflowrun WHERE id = %s
                       UNION ALL
                       SELECT r.id, r.continued_to, later.n + 1
                         FROM sagas_workflowrun r JOIN later ON r.id = later.next
                        WHERE later.n < %s)
                   SELECT id, n FROM later ORDER BY n DESC LIMIT 1""",
                [run.continued_to, CHAIN_WALK_LIMIT],
            )
            row = cur.fetchone()
        if row is not None:
            newest, after = str(row[0]), row[1]
    return RunChain(
        position=place.position, length=place.position + after, length_capped=after >= CHAIN_WALK_LIMIT,
        first_id=place.first, business_key=place.business_key,
        previous_id=str(run.continued_from) if run.continued_from else None,
        next_id=str(run.continued_to) if run.continued_to else None, newest_id=newest,
    )


# --- a run's tree (sagas.children) ----------------------------------------------------------

RUN_CHILDREN_SHOWN = 50  # children listed on a parent's page (the runs list, filtered by parent, has them all)
CHILD_COLUMNS = ("id", "workflow_name", "version", "status", "status_reason", "business_key", "tenant", "detached",
                 "created_at", "started_at", "finished_at")


@dataclass(frozen=True)
class RunParent:
    """The run that started a child run: ``run`` is None when its row is gone (retention
    archived it; ``archived`` then says whether the user can open its archived page)."""

    id: str
    run: WorkflowRun | None
    archived: bool


def run_parent(run: WorkflowRun, *, user: User) -> RunParent | None:
    """The parent of ``run`` (None for a top-level run, and no query then): one primary-key read,
    and one of the archive's index when the parent's row is gone."""
    if run.parent_run is None:
        return None
    parent = scope_runs(WorkflowRun.objects.only("id", "workflow_name", "version", "status", "tenant"), user) \
        .filter(id=run.parent_run).first()
    archived = parent is None and scope(ArchivedRun.objects.filter(run_id=run.parent_run), user).exists()
    return RunParent(id=str(run.parent_run), run=parent, archived=archived)


@dataclass(frozen=True)
class RunChildren:
    """A run's children: how many in each status, and the oldest ``RUN_CHILDREN_SHOWN``."""

    total: int
    by_status: list[tuple[str, int]]  # (status, how many) in RunStatus order, statuses with none left out
    first: list[WorkflowRun]  # oldest first (the order they were started in)

    @property
    def more(self) -> int:
        """Children not in ``first``."""
        return self.total - len(self.first)


def run_children(run_id: Any, *, user: User) -> RunChildren:
    """``run_id``'s children in ``user``'s tenants, in two queries whatever their number: their
    counts by status (one GROUP BY over the run's range of the ``run_children`` index) and the
    oldest ``RUN_CHILDREN_SHOWN`` (the same range, in its order). A run without children costs
    the first one only, an index probe that finds nothing."""
    qs = scope_runs(WorkflowRun.objects.filter(parent_run=run_id), user)
    counts = dict(qs.order_by().values("status").annotate(n=Count("id")).values_list("status", "n"))
    total = sum(counts.values())
    first = list(qs.only(*CHILD_COLUMNS).order_by("created_at", "id")[:RUN_CHILDREN_SHOWN]) if total else []
    return RunChildren(total=total, by_status=[(s, counts[s]) for s in RunStatus.values if counts.get(s)],
                       first=first)


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


def effects_by_id(ids: Iterable[int]) -> dict[int, EffectRecord]:
    return EffectRecord.objects.in_bulk(list(ids))


def run_approvals(run_id: Any) -> QuerySet[ApprovalRequest]:
    return ApprovalRequest.objects.filter(run_id=run_id).order_by("requested_at", "id")


def run_compensation(run_id: Any) -> CompensationPlan | None:
    """The run's compensation plan with its items prefetched (``plan.item_list``, each with the
    ``request_payload`` of the effect it undoes), or None."""
    plan = CompensationPlan.objects.filter(run_id=run_id).first()
    if plan is not None:
        items = list(plan.items.order_by("position"))
        plan.item_list = items  # type: ignore[attr-defined]  # for the template, not a field
        # A child run's item (sagas.children) undoes no effect of this run: it has no effect_id.
        requests = dict(EffectRecord.objects.filter(id__in=[i.effect_id for i in items if i.effect_id is not None])
                        .values_list("id", "request_payload"))
        for item in items:
            # What it undoes (amounts), for the template; not a field. A child run's item has none.
            undoes = requests.get(item.effect_id) if item.effect_id is not None else None
            item.request_payload = undoes  # type: ignore[attr-defined]
    return plan


def compensation_item_count(run_id: Any) -> int:
    return CompensationItem.objects.filter(plan__run_id=run_id).count()


def run_has_compensation(run_id: Any) -> bool:
    return CompensationPlan.objects.filter(run_id=run_id).exists()


def run_fork_steps(run_id: Any) -> list[dict[str, Any]]:
    """The positions a run can be re-run from (its steps and effects), in order."""
    rows = JournalEntry.objects.filter(run_id=run_id, kind__in=["step", "effect_intent"]).order_by("seq")
    return [{"seq": seq, "kind": kind, "name": name} for seq, kind, name in rows.values_list("seq", "kind", "name")]


_DONE = {"pause": "paused", "resume": "resumed", "retry": "retried"}
RUN_REPAIRS_LIMIT = 20


def repair_sentence(kind: str, name: str, payload: Any) -> str:
    """What an operator's repair of a run did, as a sentence ("moved from v1 to v2 by alice: fix
    for the tax rounding"); empty for an entry that is not one (``sagas.repair``, ``sagas.pausing``)."""
    p = payload if isinstance(payload, dict) else {}
    by, reason = p.get("by") or "?", p.get("reason") or ""
    said = ""
    if kind == "moved":
        said = f"moved from v{p.get('from_version')} to v{p.get('to_version')} by {by}"
    elif kind == "redriven":
        was = p.get("was") or {}
        again = f", asking step “{name}” again" if p.get("retry_seqs") else ""
        said = f"redriven from {was.get('status', '?')}{' (' + was['reason'] + ')' if was.get('reason') else ''} " \
               f"on v{p.get('version')} by {by}{again}"
    elif kind == "forked":
        undo = [u.get("name", "?") for u in p.get("undo") or []]
        how = f", compensating first: {', '.join(undo)}" if undo else (
            ", reusing later outcomes" if p.get("reuse") else "")
        said = f"re-run from step “{p.get('at', '?')}” (seq {p.get('at_seq')}) of run {p.get('from')} by {by}{how}"
    elif kind == "operator_action" and p.get("action") == "fork":
        said = f"re-run from step “{p.get('at', '?')}” (seq {p.get('at_seq')}) as run {p.get('to')} by {by}"
    elif kind == "operator_action" and p.get("action") in _DONE:
        said = f"{_DONE[p['action']]} by {by}"
    if not said:
        return ""
    return f"{said}: {reason}" if reason else said


def run_repairs(run_id: Any) -> list[dict[str, Any]]:
    """The run's repairs (moves, redrives, re-runs, pauses), newest first, each as a sentence."""
    rows = JournalEntry.objects.filter(run_id=run_id, kind__in=REPAIR_KINDS).order_by("-seq") \
        .values_list("seq", "kind", "name", "payload", "created_at")[:RUN_REPAIRS_LIMIT]
    return [{"seq": seq, "at": at, "said": said} for seq, kind, name, payload, at in rows
            if (said := repair_sentence(kind, name, payload))]


def run_forks(run: WorkflowRun) -> dict[str, Any]:
    """A run's links to the runs re-run from it and to the one it was re-run from (sagas.repair),
    and its repairs (``run_repairs``)."""
    forks = list(WorkflowRun.objects.filter(forked_from=run.id).order_by("created_at")
                 .values("id", "forked_at_seq", "status"))
    return {"forks": forks, "forked_from": run.forked_from, "forked_at_seq": run.forked_at_seq,
            "repairs": run_repairs(run.id)}

"""Runs: start, read, list, history, signal, cancel, compensate, retry, wait."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.urls import reverse
from ninja import Field, Query, Router, Schema, Status

from api.auth import ApiRequest, actor_ip
from api.errors import Problem
from api.routes.common import (
    CURSOR,
    MAX_PAGE,
    ONE_LINE,
    UUID_OR_EMPTY,
    IsoDateTime,
    Text,
    console_action,
    next_link,
    one_of,
    parse_cursor,
    run_id_of,
)
from core.redaction import redact
from operators import roles
from operators.models import AuditEntry, AuditOutcome
from operators.selectors.runs import HISTORY_PAGE_SIZE, RUNS_PAGE_SIZE, RunFilters, run_get, run_history_page, runs_page
from operators.selectors.search import search_problem
from operators.selectors.tenancy import may_see
from operators.services.actions import Actor, audit_denied, audit_done
from operators.services.limits import clip_text
from operators.services.runs import (
    run_cancel_act,
    run_compensate_act,
    run_fork_act,
    run_move_act,
    run_pause_act,
    run_redrive_act,
    run_resume_act,
    run_retry_act,
)
from operators.services.tenancy import OUTSIDE_TENANTS, check_tenant
from sagas.errors import (
    InvalidArgument,
    NotSerializable,
    RunFinished,
    StartConflict,
    WorkflowNotRegistered,
)
from sagas.integration import MAX_COST, fork_plan
from sagas.models import TERMINAL_STATUSES, RunStatus, WorkflowPause, WorkflowRun

router = Router(tags=["runs"])
MAX_DURATION_S = 10 * 366 * 86400  # ten years: past it, a timedelta overflows long before a budget means anything


class Budget(Schema):
    max_steps: int | None = Field(default=None, ge=1, le=2**31 - 1)  # the column is a PostgreSQL integer
    max_cost: float | None = Field(default=None, ge=0, le=float(MAX_COST))  # the column's NUMERIC(14, 6)
    max_duration_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)


class StartIn(Schema):
    workflow: str = Field(..., min_length=1, max_length=200, pattern=ONE_LINE)
    version: int | None = Field(None, ge=1, le=2**31 - 1)
    input: Any = None
    business_key: str = Field("", max_length=200, pattern=ONE_LINE)
    tenant: str = Field("default", min_length=1, max_length=100, pattern=ONE_LINE)
    budget: Budget | None = None


class RunOut(Schema):
    id: str
    workflow: str
    version: int
    status: str
    attention_reason: str = Field("", description="why it waits for a person (NEEDS_ATTENTION), or why it failed")
    business_key: str
    tenant: str
    input: Any
    result: Any = None
    error: Any = None
    steps_used: int
    cost_used: float
    max_steps: int | None
    max_cost: float | None
    created_at: datetime
    finished_at: datetime | None
    continued_from: str | None = Field(None, description="the run this one continues (ctx.continue_as_new)")
    continued_to: str | None = Field(None, description="the run that continues this one; follow it for the outcome")
    paused: bool = Field(False, description="held by an operator's pause (its own, or its workflow's): no worker "
                                            "takes it until it is resumed")
    parent_run_id: str | None = Field(None, description="the run that started this one as its child "
                                                        "(ctx.start_child); null for a top-level run")
    detached: bool = Field(False, description="a child run started to outlive its parent, which neither waits for "
                                              "it, cancels it nor compensates it")
    console_url: str


def actor_of(request: ApiRequest) -> Actor:
    return Actor(user=request.user, ip=actor_ip(request), system=f"api key {request.auth.name}")


def run_out(request: ApiRequest, run: WorkflowRun) -> dict[str, Any]:
    """The run as the API shows it: its input, result and error redacted as the console shows them."""
    return {
        "id": str(run.id), "workflow": run.workflow_name, "version": run.version, "status": run.status,
        "attention_reason": run.status_reason, "business_key": run.business_key, "tenant": run.tenant,
        "input": redact(run.input), "result": redact(run.result), "error": redact(run.error),
        "steps_used": run.steps_used,
        "cost_used": float(run.cost_used), "max_steps": run.max_steps,
        "max_cost": float(run.max_cost) if run.max_cost is not None else None,
        "created_at": run.created_at, "finished_at": run.finished_at,
        "continued_from": str(run.continued_from) if run.continued_from else None,
        "continued_to": str(run.continued_to) if run.continued_to else None,
        "paused": _paused(request, run),
        "parent_run_id": str(run.parent_run) if run.parent_run else None, "detached": run.detached,
        "console_url": request.build_absolute_uri(reverse("console:run", args=[run.id])),
    }


def _paused(request: ApiRequest, run: WorkflowRun) -> bool:
    """Whether ``run`` is held by a pause; the workflows' pauses (a handful of rows) are read
    once per request, not once per run of a page."""
    if run.status in TERMINAL_STATUSES:
        return False
    if run.paused_at is not None:
        return True
    pauses = getattr(request, "_workflow_pauses", None)
    if pauses is None:
        pauses = set(WorkflowPause.objects.values_list("workflow_name", "version"))
        request._workflow_pauses = pauses  # type: ignore[attr-defined]
    return (run.workflow_name, None) in pauses or (run.workflow_name, run.version) in pauses


def require(request: ApiRequest, action: str, object_type: str, object_id: Any, reason: str = "") -> Actor:
    """The caller's actor, if its role allows ``action``; else the attempt is audited and refused."""
    actor = actor_of(request)
    if not roles.can(request.user, action):
        audit_denied(actor, action, object_type, clip_text(object_id)[:100], reason=reason)
        raise Problem("forbidden", f"key {request.auth.name} may not {action.replace('.', ' ')}: "
                                   f"it needs the {roles.ACTION_ROLES[action]} role")
    return actor


@router.post("", response={200: RunOut, 201: RunOut}, summary="Start a run (idempotent per business key)")
def start_run(request: ApiRequest, body: StartIn) -> Status:
    """Start ``workflow``. The ``Idempotency-Key`` header is the business key (it wins over
    ``business_key``): the same key and input again answers the existing run with 200; the same
    key with another input is a 409 ``start-conflict`` and starts nothing."""
    from sagas import start

    key = request.headers.get("Idempotency-Key", "").strip()
    business_key = key or body.business_key
    actor = require(request, "run.start", "workflow", body.workflow, reason=business_key)
    if not may_see(request.user, body.tenant):
        AuditEntry.objects.create(
            actor=actor.user, actor_label=actor.label, action="run.start", object_type="workflow",
            object_id=clip_text(body.workflow)[:100], reason=clip_text(business_key), ip=actor.ip,
            outcome=AuditOutcome.DENIED, message=clip_text(f"tenant {body.tenant}: {OUTSIDE_TENANTS}"),
            tenant=clip_text(body.tenant)[:100],
        )
        raise Problem("forbidden", f"key {request.auth.name} may not start runs in tenant {body.tenant!r}")
    budget = body.budget or Budget()
    try:
        with transaction.atomic():
            run = start(
                body.workflow, body.input, business_key=business_key, tenant=body.tenant, version=body.version,
                started_by=request.user, started_via="api", max_steps=budget.max_steps, max_cost=budget.max_cost,
                max_duration=timedelta(seconds=budget.max_duration_s) if budget.max_duration_s else None,
            )
            if run.created_now:
                audit_done(actor, "run.start", "run", run.id, reason=business_key,
                           after={"state": run.status, "workflow": run.workflow_name, "version": run.version},
                           tenant=run.tenant)
    except WorkflowNotRegistered as exc:
        raise Problem("unknown-workflow", str(exc)) from None
    except StartConflict as exc:
        raise Problem("start-conflict", str(exc)) from None
    except (InvalidArgument, NotSerializable) as exc:
        raise Problem("validation", str(exc)) from None
    return Status(201 if run.created_now else 200, run_out(request, run))



# --- the runs list ------------------------------------------------------------------------------

STATUSES = tuple(RunStatus.values)


class RunListQuery(Schema):
    status: str = Field("", max_length=40, pattern=one_of(STATUSES), description=f"one of {', '.join(STATUSES)}")
    workflow: str = Field("", max_length=200)
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="with `workflow`")
    reason: str = Field("", max_length=500, description="status reasons, comma-separated (any of them)")
    search: str = Field("", max_length=200, description="a run id, its first hex digits, part of a business key, "
                        "or its start followed by `*` (`KYC-0001*`)")
    tenant: str = Field("", max_length=100, description="within the key's tenants")
    created_from: IsoDateTime | None = Field(None, description="inclusive")
    created_to: IsoDateTime | None = Field(None, description="exclusive")
    top_level: bool = Field(False, description="only runs no run started as its child")
    parent: str = Field("", max_length=100, pattern=UUID_OR_EMPTY,
                        description="only the child runs of this run (its id)")
    cursor: str = Field("", max_length=100, pattern=CURSOR, description="from the previous page's `cursor`")
    limit: int = Field(RUNS_PAGE_SIZE, ge=1, le=MAX_PAGE)


class RunSummary(Schema):
    id: str
    workflow: str
    version: int
    status: str
    attention_reason: str
    business_key: str
    tenant: str
    steps_used: int
    cost_used: float
    created_at: datetime
    finished_at: datetime | None
    parent_run_id: str | None = Field(None, description="the run that started this one as its child; null for a "
                                                        "top-level run")
    detached: bool = False


class RunList(Schema):
    items: list[RunSummary]
    cursor: str | None = Field(None, description="pass as `cursor` for the next page; null on the last page")
    next: str | None = Field(None, description="the next page's URL; null on the last page")


def _summary(run: WorkflowRun) -> dict[str, Any]:
    return {"id": str(run.id), "workflow": run.workflow_name, "version": run.version, "status": run.status,
            "attention_reason": run.status_reason, "business_key": run.business_key, "tenant": run.tenant,
            "steps_used": run.steps_used, "cost_used": float(run.cost_used), "created_at": run.created_at,
            "finished_at": run.finished_at, "parent_run_id": str(run.parent_run) if run.parent_run else None,
            "detached": run.detached}


def _aware(when: datetime | None) -> datetime | None:
    """A time without a zone is UTC (the console shows UTC)."""
    return when.replace(tzinfo=UTC) if when is not None and when.tzinfo is None else when


@router.get("", response=RunList, summary="Runs of the key's tenants, newest first, a page at a time")
def list_runs(request: ApiRequest, query: Query[RunListQuery]) -> dict[str, Any]:
    """The console's runs list: the same filters, keyset pages (follow ``next``; no totals)."""
    if query.status and query.status not in STATUSES:
        raise Problem("validation", f"status must be one of {', '.join(STATUSES)}")
    reasons = tuple(r.strip() for r in query.reason.split(",") if r.strip())
    parent = ""
    if query.parent.strip():
        try:
            parent = str(uuid.UUID(query.parent.strip()))
        except ValueError:
            raise Problem("validation", f"parent must be a run id, not {query.parent[:100]!r}") from None
    filters = RunFilters(status=query.status, workflow=query.workflow.strip(), version=query.version,
                         tenant=query.tenant.strip(), created_from=_aware(query.created_from),
                         created_to=_aware(query.created_to),
                         search=query.search.strip(), reasons=reasons, top_level=query.top_level, parent=parent)
    if "\x00" in "".join((query.workflow, query.tenant, query.search, query.reason)):
        raise Problem("validation", "a filter holds a NUL character")
    if (problem := search_problem(filters.search)) is not None:
        raise Problem("validation", problem)
    page = runs_page(filters, user=request.user, cursor=parse_cursor(query.cursor, key=uuid.UUID), size=query.limit)
    return {"items": [_summary(r) for r in page.items], "cursor": page.next_cursor,
            "next": next_link(request, "cursor", page.next_cursor)}


# --- a run's history ----------------------------------------------------------------------------


class HistoryQuery(Schema):
    before: int | None = Field(None, ge=1, le=2**31 - 1, description="entries with a seq below this one")
    limit: int = Field(HISTORY_PAGE_SIZE, ge=1, le=MAX_PAGE)


class HistoryEntry(Schema):
    seq: int
    created_at: datetime
    kind: str
    name: str
    worker_id: str
    payload: Any = Field(None, description="redacted with the console's policy (core/redaction.py)")


class History(Schema):
    run_id: str
    entries: list[HistoryEntry] = Field(..., description="newest first")
    before: int | None = Field(None, description="pass as `before` for the older entries; null: nothing older")
    next: str | None = None


@router.get("/{run_id}/history", response=History, summary="A run's journal, newest first, a page at a time")
def run_history(request: ApiRequest, run_id: str, query: Query[HistoryQuery]) -> dict[str, Any]:
    run = run_get(run_id_of(run_id), user=request.user)
    if run is None:
        raise Problem("not-found", f"no run {run_id[:100]!r} (or not in this key's tenants)")
    page = run_history_page(run.id, before=query.before, size=query.limit)
    entries = [{"seq": e.seq, "created_at": e.created_at, "kind": e.kind, "name": e.name, "worker_id": e.worker_id,
                "payload": redact(e.payload)} for e in page.entries]
    return {"run_id": str(run.id), "entries": entries, "before": page.next_before,
            "next": next_link(request, "before", page.next_before)}


# --- signal ------------------------------------------------------------------------------------


class SignalIn(Schema):
    name: Text = Field(..., min_length=1, max_length=200)
    payload: Any = None


class Done(Schema):
    run: RunOut
    message: str


@router.post("/{run_id}/signal", response={202: Done}, summary="Deliver a signal to a run (ctx.wait_for)")
def signal_run(request: ApiRequest, run_id: str, body: SignalIn) -> Status:
    """Kept until a ``ctx.wait_for(name)`` takes it. 409 ``conflict`` if the run is finished. A run
    that continued as new passes it on down its chain: ``run`` in the answer is the one that got it."""
    from sagas import signal

    run_id = run_id_of(run_id)
    actor = actor_of(request)
    check_tenant(actor, "run.signal", "run", run_id, reason=body.name)
    actor = require(request, "run.signal", "run", run_id, reason=body.name)
    try:
        with transaction.atomic():
            got_it = signal(run_id=run_id, name=body.name, payload=body.payload, actor=actor.label)
            audit_done(actor, "run.signal", "run", run_id, reason=body.name,
                       after={"signal": body.name, "delivered_to": got_it})
    except WorkflowRun.DoesNotExist:
        raise Problem("not-found", f"no run {run_id!r}") from None
    except RunFinished as exc:
        raise Problem("conflict", str(exc)) from None
    except (InvalidArgument, NotSerializable) as exc:
        raise Problem("validation", str(exc)) from None
    return Status(202, {"run": run_out(request, WorkflowRun.objects.get(id=got_it)),
                        "message": f"signal {body.name!r} delivered" + (
                            f" to run {got_it}, which continues this one" if got_it != run_id else "")})


# --- cancel, compensate, retry -----------------------------------------------------------------

EXPECTED = Field("", max_length=40, description="the run's status you saw (required): a run that moved on "
                                                  "is a 409 stale-state naming its status now")
REASON = Field(..., min_length=1, max_length=4000, description="goes into the audit log and the run's history")


class CancelIn(Schema):
    reason: Text = REASON
    compensate: bool = Field(..., description="undo its succeeded effects (COMPENSATING), or leave them (CANCELLED)")
    expected: str = EXPECTED


class ActIn(Schema):
    reason: Text = REASON
    expected: str = EXPECTED


def _acted(request: ApiRequest, run_id: str, message: str) -> dict[str, Any]:
    run = WorkflowRun.objects.get(id=run_id)
    return {"run": run_out(request, run), "message": f"{message}; the run is now {run.status}"}


@router.post("/{run_id}/cancel", response=Done, summary="Cancel a run (and compensate it, if asked)")
def cancel_run(request: ApiRequest, run_id: str, body: CancelIn) -> dict[str, Any]:
    run_id = run_id_of(run_id)
    with console_action("run", run_id):
        run_cancel_act(actor_of(request), run_id=run_id, reason=body.reason, compensate=body.compensate,
                       expected=body.expected.strip() or None)
    return _acted(request, run_id, "cancelled" + (" (compensating what it did)" if body.compensate else ""))


@router.post("/{run_id}/compensate", response=Done, summary="Undo a run's succeeded effects")
def compensate_run(request: ApiRequest, run_id: str, body: ActIn) -> dict[str, Any]:
    run_id = run_id_of(run_id)
    with console_action("run", run_id):
        run_compensate_act(actor_of(request), run_id=run_id, reason=body.reason,
                           expected=body.expected.strip() or None)
    return _acted(request, run_id, "compensation started")


@router.post("/{run_id}/pause", response=Done, summary="Pause a run")
def pause_run(request: ApiRequest, run_id: str, body: ActIn) -> dict[str, Any]:
    """Hold the run: no worker takes it, and its timers wait, until it is resumed. A worker
    advancing it finishes the step in flight, records it, and hands the run back at the next
    step boundary. A paused run is a 409; a finished one, a 409 too."""
    run_id = run_id_of(run_id)
    with console_action("run", run_id):
        run_pause_act(actor_of(request), run_id=run_id, reason=body.reason, expected=body.expected.strip() or None)
    return _acted(request, run_id, "paused")


@router.post("/{run_id}/resume", response=Done, summary="Resume a paused run")
def resume_run(request: ApiRequest, run_id: str, body: ActIn) -> dict[str, Any]:
    """Lift the run's own pause: it is queued for a worker again, and a timer that fell due
    during the pause fires now. A run that is not paused, or is held by its workflow's pause
    (``POST /workflows/resume``), is a 409."""
    run_id = run_id_of(run_id)
    with console_action("run", run_id):
        run_resume_act(actor_of(request), run_id=run_id, reason=body.reason, expected=body.expected.strip() or None)
    return _acted(request, run_id, "resumed")


class MoveIn(Schema):
    version: int = Field(..., ge=1, le=2**31 - 1, description="the version of the workflow to move the run to")
    reason: Text = REASON
    expected: str = EXPECTED


class RedriveIn(Schema):
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="move it to this version first (checked)")
    reason: Text = REASON
    expected: str = EXPECTED


@router.post("/{run_id}/move", response=Done, summary="Move a run to another version of its code")
def move_run(request: ApiRequest, run_id: str, body: MoveIn) -> dict[str, Any]:
    """Only if the run's history replays cleanly on that code, checked under the run's lock; a
    run that diverges is a 409 naming where. A run a worker is advancing is a 409: pause it
    first. A run parked for its code goes on at once."""
    run_id = run_id_of(run_id)
    with console_action("run", run_id):
        run_move_act(actor_of(request), run_id=run_id, version=body.version, reason=body.reason,
                     expected=body.expected.strip() or None)
    return _acted(request, run_id, f"moved to version {body.version}")


@router.post("/{run_id}/redrive", response=Done, summary="Continue a FAILED run from where it failed")
def redrive_run(request: ApiRequest, run_id: str, body: RedriveIn) -> dict[str, Any]:
    """A FAILED run (its effects in place), or one parked because its code diverged, goes on
    from its failing step (a failed step is asked again), keeping its id and history; onto
    ``version`` first if given."""
    run_id = run_id_of(run_id)
    with console_action("run", run_id):
        run_redrive_act(actor_of(request), run_id=run_id, version=body.version, reason=body.reason,
                        expected=body.expected.strip() or None)
    return _acted(request, run_id, "redriven")


class ForkIn(Schema):
    at_seq: int = Field(..., ge=1, le=2**31 - 1, description="the journal position (seq) of the step to re-run from")
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="run the new run on this version (checked)")
    forks_seen: int | None = Field(None, ge=0, le=2**31 - 1, description="how many re-runs of this run you saw; "
                                                                        "more now is a 409 and nothing is made")
    compensate_first: bool = Field(False, description="compensate the effects done after the step (newest first, "
                                                      "by the new run before it goes on) instead of reusing them")
    reason: Text = REASON
    expected: str = EXPECTED


class ForkEffectOut(Schema):
    name: str
    connector: str
    status: str
    seq: int
    irreversible: bool
    fate: str = Field(..., description="kept, reused, undone (compensated first), again or blocks")
    note: str


class ForkPlanOut(Schema):
    at_seq: int
    at: str
    effects: list[ForkEffectOut]
    copied: int
    steps_copied: int
    blockers: list[str]
    compensate_first: bool


@router.get("/{run_id}/fork", response=ForkPlanOut, summary="What re-running a run from a step would do")
def fork_preview_run(request: ApiRequest, run_id: str, at_seq: int, compensate_first: bool = False) -> dict[str, Any]:
    """Each effect of the run and its fate if the run were re-run from ``at_seq`` (with its later
    effects compensated first, or reused); nothing is written. Any role that may see the run."""
    run = run_get(run_id_of(run_id), user=request.user)
    if run is None:
        raise Problem("not-found", f"no run {run_id[:100]!r}")
    plan = fork_plan(run, at_seq, compensate_first=compensate_first)
    return {"at_seq": plan.at_seq, "at": plan.at_name, "copied": plan.copied, "steps_copied": plan.steps_copied,
            "blockers": plan.blockers, "effects": [vars(e) for e in plan.effects],
            "compensate_first": plan.compensate_first}


@router.post("/{run_id}/fork", response={201: Done}, summary="Re-run a run from a step, as a new linked run")
def fork_run(request: ApiRequest, run_id: str, body: ForkIn) -> Status:
    """The new run's history starts with a copy of this run's before the step; it executes from
    there. Effects before the step keep their outcomes; effects done after it are reused when the
    new run asks for them with the same payload, or with ``compensate_first`` compensated by the new
    run before it goes on. An unknown outcome anywhere is a 409."""
    run_id = run_id_of(run_id)
    with console_action("run", run_id):
        fork = run_fork_act(actor_of(request), run_id=run_id, at_seq=body.at_seq, version=body.version,
                            reason=body.reason, expected=body.expected.strip() or None, forks_seen=body.forks_seen,
                            compensate_first=body.compensate_first)
    return Status(201, {"run": run_out(request, fork), "message": f"re-run from seq {body.at_seq} of run {run_id}"})


@router.post("/{run_id}/retry", response=Done, summary="Retry a run that needs attention")
def retry_run(request: ApiRequest, run_id: str, body: ActIn) -> dict[str, Any]:
    run_id = run_id_of(run_id)
    with console_action("run", run_id):
        run_retry_act(actor_of(request), run_id=run_id, reason=body.reason, expected=body.expected.strip() or None)
    return _acted(request, run_id, "retried")

"""The calls a workflow makes about its child runs: ``ctx.start_child``, ``ctx.wait_child``,
``ctx.gather`` and ``ctx.signal_child`` (the guarantees are ``sagas.children``')."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from sagas.children import AWAITING_CHILDREN, IN_FLIGHT, STARTED_VIA, ChildHandle, child_id, report_to_parent
from sagas.errors import ChildFailed, InvalidArgument, RunFinished, StartConflict, Suspend
from sagas.events import send_run_changed
from sagas.models import TERMINAL_STATUSES, JournalEntry, JournalKind, RunStatus, WorkflowRun
from sagas.replay.cursor import JournalCursor
from sagas.runtime import queue
from sagas.runtime.crashpoints import crash_point
from sagas.services import version_sync
from sagas.store.systemdb import dumps
from sagas.summaries import summary_compute
from sagas.validation import checked_json, checked_text, priority_check, start_arguments_check
from sagas.versions import registry
from sagas.waits import signal_send_locked

K = JournalKind


def start_child(
    ctx: JournalCursor,
    workflow: str,
    input: Any = None,
    *,
    business_key: str = "",
    detached: bool = False,
    max_cost: float | None = None,
    max_steps: int | None = None,
    priority: int | None = None,
) -> ChildHandle:
    """Start ``workflow`` as a child of the run (see the module). Returns its handle."""
    call = ctx.unique_name(f"child:{workflow}", space="child")
    entry = ctx.replay_next(K.CHILD_STARTED, call)
    if entry is not None:
        recorded = entry.payload
        return ChildHandle(recorded["run_id"], recorded["workflow"], call, bool(recorded.get("detached")))
    ctx.before_live()
    definition = registry.get(workflow)  # the newest version this worker has
    checked = start_arguments_check(
        input=input, business_key=business_key, tenant=ctx.tenant, started_by=None, started_via=STARTED_VIA,
        max_steps=max_steps, max_cost=max_cost, max_duration=None,
    )
    run = ctx.claimed
    parent_cost = run.max_cost
    budget_from_parent = max_cost is None and parent_cost is not None and not detached
    child_cost: Decimal | None
    if parent_cost is not None and budget_from_parent:
        child_cost = max(Decimal(parent_cost) - Decimal(str(ctx.cost_used)), Decimal(0))
    elif max_cost is not None:
        child_cost = Decimal(str(checked.max_cost))
    else:
        child_cost = Decimal(definition.max_cost) if definition.max_cost is not None else None
    summary = summary_compute(definition.summary, checked.input, workflow=definition.name, version=definition.version)
    version_sync(definition=definition)  # before the transaction: it caches what it wrote
    new_id = child_id(ctx.run_id, call)
    handle = ChildHandle(new_id, definition.name, call, detached)
    started_by = WorkflowRun.objects.filter(id=ctx.run_id).values_list("started_by_id", "started_by__username").first()
    with transaction.atomic():
        ctx.append(K.CHILD_STARTED, call, dumps({**handle.as_dict(), "version": definition.version,
                                                 "budget": "parent" if budget_from_parent else "own"}))
        crash_point("child_start_uncommitted", call)
        if business_key and WorkflowRun.objects.filter(tenant=ctx.tenant, workflow_name=definition.name,
                                                       business_key=business_key).exists():
            raise StartConflict(
                f"cannot start child {definition.name}: a run with business key {business_key!r} already exists "
                f"in tenant {ctx.tenant!r}; each child needs a key of its own (or none)")
        WorkflowRun.objects.create(
            id=new_id, workflow_name=definition.name, version=definition.version,
            definition_hash=definition.definition_hash, input=checked.input, summary=summary,
            business_key=business_key, tenant=ctx.tenant, status=RunStatus.PENDING, last_seq=1,
            max_steps=max_steps if max_steps is not None else definition.max_steps, max_cost=child_cost,
            max_duration=definition.max_duration, started_by_id=started_by[0] if started_by else None,
            started_via=STARTED_VIA, priority=priority_check(priority) if priority is not None else run.priority,
            parent_run=ctx.run_id, detached=detached,
        )
        JournalEntry.objects.create(
            run_id=new_id, seq=1, kind=K.STARTED, worker_id=ctx.worker_id, created_at=timezone.now(),
            payload={
                "input": checked.input, "version": definition.version, "definition_hash": definition.definition_hash,
                "business_key": business_key, "tenant": ctx.tenant,
                "started_by": started_by[1] if started_by else None, "started_via": STARTED_VIA,
                "parent": {"run": ctx.run_id, "call": call, "detached": detached},
            },
        )
    crash_point("after_child_start", call)
    queue.enqueue_new_run_after_commit(new_id, definition.definition_hash,
                                       priority=priority if priority is not None else run.priority)
    send_run_changed(new_id, RunStatus.PENDING, cause=K.STARTED)
    return handle


def join(ctx: JournalCursor, handles: list[ChildHandle], *, what: str) -> list[Any]:
    """``wait_child``/``gather``: the children's results in the order of ``handles``, or
    ``ChildFailed`` for the first that did not complete; suspends until that is known."""
    if not handles:
        return []
    for h in handles:
        if not isinstance(h, ChildHandle):
            raise InvalidArgument(f"{what} takes handles returned by ctx.start_child, not {type(h).__name__}")
    name = ctx.unique_name("join", space="join")
    entry = ctx.replay_next(K.CHILDREN_JOINED, name)
    if entry is not None:
        return _joined(ctx, handles, entry.payload.get("failed"))
    ctx.before_live()  # past the journal: a replay check stops here, writing nothing
    ended = {h.call: _finished(ctx, h.call) for h in handles}
    missing = [h for h in handles if ended[h.call] is None]
    if missing and _report_ended(ctx.run_id, missing):
        # An ended child had not been reported (its report was lost): it is journaled now, so
        # suspending is refused (something arrived) and the run replays with it.
        raise Suspend(f"{what}: a child's end was reported late", wake_at=None)
    failed = next((h for h in handles if (ended[h.call] or {}).get("status", RunStatus.COMPLETED)
                   != RunStatus.COMPLETED), None)
    if failed is None and missing:
        raise Suspend(f"{what}: waiting for {len(missing)} of {len(handles)} child run(s)", wake_at=None,
                      awaiting=frozenset(h.call for h in missing), status_reason=_wait_reason(ctx, missing))
    cost = sum(float((ended[h.call] or {}).get("cost") or 0) for h in handles
               if (ended[h.call] or {}).get("budget") == "parent")
    payload: dict[str, Any] = {"calls": [h.call for h in handles], "failed": failed.call if failed else None}
    if cost:
        payload["cost"] = cost
    ctx.append(K.CHILDREN_JOINED, name, dumps(payload), cost=cost)
    return _joined(ctx, handles, failed.call if failed else None)


def _wait_reason(ctx: JournalCursor, missing: list[ChildHandle]) -> str:
    """``AWAITING_CHILDREN`` when the join waits for every attached child of the run still in
    flight (a gather of a fan-out): then only the last one's end, or a failure, wakes the run.
    Otherwise each awaited child's end wakes it, and it looks again."""
    if any(h.detached for h in missing):
        return ""
    in_flight = WorkflowRun.objects.filter(parent_run=ctx.run_id, detached=False, status__in=IN_FLIGHT)
    awaited = {h.run_id for h in missing}
    return AWAITING_CHILDREN if all(str(i) in awaited for i in in_flight.values_list("id", flat=True)) else ""


def _finished(ctx: JournalCursor, call: str) -> dict[str, Any] | None:
    """The ``child_finished`` payload of the child started by ``call``, as loaded; None if not yet."""
    entry = ctx.recorded_event(K.CHILD_FINISHED, call)
    return entry.payload if entry is not None else None


def _ended(ctx: JournalCursor, call: str) -> dict[str, Any]:
    payload = _finished(ctx, call)
    if payload is None:  # a join was journaled, so each child it names had ended before it
        raise RuntimeError(f"the journal has a join of {call!r} but not its end")
    return payload


def _joined(ctx: JournalCursor, handles: list[ChildHandle], failed: str | None) -> list[Any]:
    if failed is not None:
        h = next(h for h in handles if h.call == failed)
        p = _ended(ctx, failed)
        raise ChildFailed(child_run_id=h.run_id, workflow=h.workflow, call=h.call, status=p["status"],
                          error=p.get("error"))
    return [_ended(ctx, h.call).get("result") for h in handles]


def signal_child(ctx: JournalCursor, handle: ChildHandle, name: str, payload: Any = None) -> None:
    """Send signal ``name`` to a child, once: the parent's ``child_signalled`` entry and the
    child's ``signal_received`` are written in one transaction."""
    # "#" is the position counter's: a child's call "child:x#2" is named "child:x~2" here.
    call = ctx.unique_name(f"signal:{handle.call.replace('#', '~')}:{name.replace('#', '~')}", space="child_signal")
    if ctx.replay_next(K.CHILD_SIGNALLED, call) is not None:
        return
    checked_text(name, what="the signal name", max_length=200, required=True, one_line=True)
    payload = checked_json(payload, what="the signal's payload")
    ctx.before_live()
    with transaction.atomic():
        ctx.append(K.CHILD_SIGNALLED, call, dumps({"child": handle.run_id, "signal": name}))
        try:
            signal_send_locked(run_id=handle.run_id, name=name, payload=payload, actor=f"parent {ctx.run_id}")
        except RunFinished:
            pass  # the child has ended: the signal is recorded as sent, nobody waits for it


def _chain_end(run: WorkflowRun) -> WorkflowRun:
    """A child that continued as new: the run its chain is at now."""
    for _hop in range(10_000):
        if run.continued_to is None:
            break
        nxt = WorkflowRun.objects.filter(id=run.continued_to).first()
        if nxt is None:
            break
        run = nxt
    return run


def _report_ended(parent_id: str, handles: list[ChildHandle]) -> bool:
    """Report to ``parent_id`` those of ``handles`` that have ended but are not journaled
    there (under the parent's row lock). True if any was reported."""
    ids = [h.run_id for h in handles]
    runs = {str(r.id): r for r in WorkflowRun.objects.filter(id__in=ids)}
    reported = False
    for h in handles:
        child = runs.get(h.run_id)
        if child is None:
            continue
        child = _chain_end(child) if child.continued_to else child
        if child.status in TERMINAL_STATUSES and child.status_reason != "continued_as_new":
            reported |= report_to_parent(parent_id, child, h.call)
    return reported

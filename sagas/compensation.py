"""Sagas: undo a run's completed effects, newest first.

A plan has one item per SUCCEEDED effect of the run, newest first. An item whose
connector can undo it compensates through the ledger with the key
``"<effect key>:compensate"``, under exactly the rules of a forward effect, so a
crash mid-compensation repeats nothing. An item whose connector is irreversible
(or cannot compensate) is listed as IRREVERSIBLE with nothing to run, so people
see what could not be undone. A compensation that fails or whose outcome is
unknown stops the plan: the run goes to NEEDS_ATTENTION and nothing after it is
attempted (never skipped silently).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from uuid import UUID

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from ledger.connectors import Operation, get_connector
from ledger.errors import ConnectorNotRegistered, EffectFailed, OutcomeUnknown
from ledger.models import EffectKind, EffectRecord, EffectStatus
from ledger.protocol import run_operation
from sagas import tracing
from sagas.errors import ActionNotAllowed, CompensationStuck, EffectUnknown, RunFinished, StepFailed, Suspend
from sagas.events import send_run_changed
from sagas.models import (
    OPEN_APPROVAL_STATES,
    RUN_TRANSITIONS,
    ApprovalRequest,
    ApprovalState,
    CompensationItem,
    CompensationItemState,
    CompensationPlan,
    CompensationState,
    JournalKind,
    RunStatus,
    WorkflowRun,
    check_compensation_transition,
    check_transition,
)
from sagas.replay.cursor import JournalCursor
from sagas.runtime import queue
from sagas.runtime.crashpoints import crash_point
from sagas.store import systemdb
from sagas.store.locks import run_lock
from sagas.store.systemdb import dumps
from sagas.validation import FREE_TEXT_CHARS, checked_text

log = logging.getLogger("sagas.compensation")
K = JournalKind
ItemState = CompensationItemState


@dataclass(frozen=True)
class PlannedItem:
    position: int
    effect_id: int | None
    step_name: str
    connector: str
    compensation_key: str
    reversible: bool
    why_not: str = ""
    # A child run (sagas.children) undone by its own compensation: its id and status now.
    child_run: str = ""
    child_status: str = ""


# A child in these statuses has something its parent's compensation must stop or undo.
_CHILD_TO_UNDO = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION,
                  RunStatus.COMPENSATING, RunStatus.COMPLETED, RunStatus.FAILED)


def _children_to_undo(run_id: UUID | str) -> list[WorkflowRun]:
    """The run's attached children a compensation of it stops or undoes: in flight, being
    compensated, completed, or failed with effects of their own still in place."""
    kids = list(WorkflowRun.objects.filter(parent_run=run_id, detached=False, status__in=_CHILD_TO_UNDO)
                .only("id", "workflow_name", "status", "finished_at", "created_at"))
    return [k for k in kids if k.status != RunStatus.FAILED or needs_compensation(str(k.id))]


def compensation_preview(*, run: WorkflowRun) -> list[PlannedItem]:
    """What a compensation of ``run`` would do, newest first: its succeeded effects and its
    children (``sagas.children``: those still running are stopped first, as the newest), each
    child undone by its own compensation. Writes nothing."""
    effects = list(EffectRecord.objects.filter(
        run_id=run.id, kind=EffectKind.EFFECT, status=EffectStatus.SUCCEEDED
    ).order_by("-completed_at", "-id"))
    now = timezone.now()
    dated: list[tuple] = [(e.completed_at or now, e.id, e) for e in effects]
    dated += [(k.finished_at if k.status in (RunStatus.COMPLETED, RunStatus.FAILED) and k.finished_at else now,
               0, k) for k in _children_to_undo(run.id)]
    dated.sort(key=lambda t: (t[0], t[1]), reverse=True)
    items = []
    for position, (_when, _id, thing) in enumerate(dated):
        if isinstance(thing, WorkflowRun):
            items.append(PlannedItem(
                position=position, effect_id=None, step_name=f"child:{thing.workflow_name}",
                connector="", compensation_key="", reversible=True, child_run=str(thing.id),
                child_status=thing.status,
            ))
            continue
        effect = thing
        try:
            conn = get_connector(effect.connector)
        except ConnectorNotRegistered:
            reversible, why = False, "connector not registered here"
        else:
            if conn.irreversible:
                reversible, why = False, "irreversible: the provider cannot undo it"
            elif not conn.can_compensate():
                reversible, why = False, "the connector has no compensation"
            else:
                reversible, why = True, ""
        items.append(
            PlannedItem(
                position=position, effect_id=effect.id, step_name=effect.step_name, connector=effect.connector,
                compensation_key=f"{effect.idempotency_key}:compensate" if reversible else "",
                reversible=reversible, why_not=why,
            )
        )
    return items


def plan_create(*, run: WorkflowRun, reason: str, trigger: str, user: User | None, actor: str) -> CompensationPlan:
    """Create the plan (inside the caller's transaction, run row locked)."""
    if CompensationPlan.objects.filter(run=run).exists():
        raise ActionNotAllowed(f"run {run.id} already has a compensation plan")
    plan = CompensationPlan.objects.create(
        run=run, reason=reason, trigger=trigger, created_by=user, created_by_label=actor, created_at=timezone.now()
    )
    preview = compensation_preview(run=run)
    CompensationItem.objects.bulk_create(
        CompensationItem(
            plan=plan, position=item.position, effect_id=item.effect_id, step_name=item.step_name,
            connector=item.connector, compensation_key=item.compensation_key, child_run=item.child_run or None,
            state=ItemState.PENDING if item.reversible else ItemState.IRREVERSIBLE,
        )
        for item in preview
    )
    systemdb.append_event(
        str(run.id), kind=K.COMPENSATION_STARTED, name="", worker=actor,
        payload=dumps({
            "reason": reason, "trigger": trigger, "by": actor,
            "items": [{"step": i.step_name, "connector": i.connector, "reversible": i.reversible, "why_not": i.why_not,
                       **({"child_run": i.child_run} if i.child_run else {})}
                      for i in preview],
        }),
    )
    return plan


def approvals_expire_open(*, run: WorkflowRun, why: str, by: str = "system") -> None:
    """The run's open approvals (PENDING, ESCALATED) become EXPIRED, decided by ``by (why)``:
    the run is being cancelled or compensated, so nobody may decide them any more. Inside
    the caller's transaction, with the run's row locked first (``sagas.store.locks``)."""
    ApprovalRequest.objects.filter(run=run, state__in=OPEN_APPROVAL_STATES).update(
        state=ApprovalState.EXPIRED, decided_by_label=f"{by} ({why})", decided_at=timezone.now()
    )


def compensation_start(*, run_id: str, user: User | None, reason: str, actor: str = "") -> CompensationPlan:
    """An operator asks to undo a run's effects. The run leaves any worker (fence +1),
    goes COMPENSATING and is enqueued. Refused for finished runs and running compensations.

    Locks in ``sagas.store.locks``' order: the run, its open approvals (expired), then the plan."""
    actor = actor or (user.get_username() if user is not None else "system")
    checked_text(reason, what="reason", max_length=FREE_TEXT_CHARS)
    if not reason.strip():
        raise ActionNotAllowed("a reason is required")
    with transaction.atomic():
        run = run_lock(run_id=run_id)
        if run.status in (RunStatus.COMPLETED, RunStatus.COMPENSATED, RunStatus.CANCELLED):
            raise RunFinished(f"run {run.id} is {run.status}; there is nothing to compensate")
        if run.status == RunStatus.COMPENSATING:
            raise ActionNotAllowed(f"run {run.id} is already compensating")
        check_transition(run.status, RunStatus.COMPENSATING)
        approvals_expire_open(run=run, why="compensation started", by=actor)
        plan = plan_create(run=run, reason=reason, trigger="operator", user=user, actor=actor)
        run_move_to_compensating(run=run)
    return plan


def run_move_to_compensating(*, run: WorkflowRun) -> None:
    """A run (locked by the caller, its plan created) leaves any worker (fence +1, no lease)
    and goes COMPENSATING; a worker is woken for it after commit."""
    WorkflowRun.objects.filter(id=run.id).update(
        status=RunStatus.COMPENSATING, status_reason="", error=None, fence=run.fence + 1, lease_owner="",
        lease_expires_at=None, wake_at=None, finished_at=None, updated_at=timezone.now(),
    )
    queue.enqueue_after_commit(run.id, run.definition_hash, compensating=True, priority=run.priority)
    send_run_changed(run.id, RunStatus.COMPENSATING, cause=K.COMPENSATION_STARTED)


def compensate_claimed(ctx: JournalCursor) -> None:
    """Run the plan's remaining items in order, under the worker's claim (status COMPENSATING).

    Returns when every item is done (the caller marks the run COMPENSATED). Raises
    ``CompensationStuck`` when an item failed or is UNKNOWN.
    """
    plan = CompensationPlan.objects.get(run_id=UUID(ctx.run_id))
    if plan.state != CompensationState.RUNNING:
        with transaction.atomic():
            check_compensation_transition(plan.state, CompensationState.RUNNING)
            plan.state = CompensationState.RUNNING
            plan.save(update_fields=["state"])
    for item in plan.items.order_by("position"):
        if item.state in (ItemState.SUCCEEDED, ItemState.IRREVERSIBLE):
            continue
        if item.child_run is not None:
            _undo_child(ctx, item)
            continue
        original = EffectRecord.objects.get(id=int(item.effect_id or 0))
        op = Operation(get_connector(item.connector), "compensation")
        payload = {"effect_id": original.id, "payload": original.request_payload, "result": original.result}
        name = f"compensate:{item.step_name}"
        crash_point("before_compensation", item.step_name)
        try:
            with tracing.compensation_span(ctx, item.step_name, item.connector, item.compensation_key):
                record = run_operation(
                    ctx, op, name=name, key=item.compensation_key, payload=payload, connector_name=item.connector
                )
        except EffectFailed as exc:
            _item_stuck(ctx, plan, item, ItemState.FAILED, "compensation_failed", str(exc))
        except OutcomeUnknown as exc:
            _item_stuck(ctx, plan, item, ItemState.UNKNOWN, "compensation_unknown", exc.message)
        with transaction.atomic():  # the run's row (fenced append) before the item: sagas.store.locks' order
            ctx.append(K.COMPENSATION_ITEM, name, dumps({"step": item.step_name, "state": ItemState.SUCCEEDED,
                                                           "downstream_ref": record.downstream_ref}))
            item.state = ItemState.SUCCEEDED
            item.compensation_effect_id = record.id
            item.save(update_fields=["state", "compensation_effect_id"])
            send_run_changed(ctx.run_id, RunStatus.COMPENSATING, cause=K.COMPENSATION_ITEM)
    with transaction.atomic():
        check_compensation_transition(plan.state, CompensationState.COMPLETED)
        plan.state = CompensationState.COMPLETED
        plan.finished_at = timezone.now()
        plan.save(update_fields=["state", "finished_at"])


def _undo_child(ctx: JournalCursor, item: CompensationItem) -> None:  # item.child_run is set
    """A child run in the plan: stop it (cancel, compensating) if it is in flight, or start
    its compensation if it completed or failed with effects; done once it is COMPENSATED or
    CANCELLED. Until then the compensation is handed back (``Suspend``), holding no worker;
    the child's end wakes it (``sagas.children``), and a child whose own compensation needs a
    person keeps it waiting, never skipped."""
    child = WorkflowRun.objects.get(id=str(item.child_run))
    if child.status not in (RunStatus.COMPENSATING, RunStatus.COMPENSATED, RunStatus.CANCELLED):
        child_compensation_start(child_id=str(child.id), actor=f"parent {ctx.run_id}",
                                 reason=f"its parent run {ctx.run_id} is compensating: {item.plan.reason}")
    child.refresh_from_db(fields=["status"])
    if child.status not in (RunStatus.COMPENSATED, RunStatus.CANCELLED):
        raise Suspend(f"waiting for child run {child.id} ({child.status}) to be undone", wake_at=None)
    with transaction.atomic():
        ctx.append(K.COMPENSATION_ITEM, f"compensate:{item.step_name}:{child.id}",
                   dumps({"step": item.step_name, "state": ItemState.SUCCEEDED, "child_run": str(child.id),
                          "child_status": child.status}))
        item.state = ItemState.SUCCEEDED
        item.save(update_fields=["state"])
        send_run_changed(ctx.run_id, RunStatus.COMPENSATING, cause=K.COMPENSATION_ITEM)


def child_compensation_start(*, child_id: str, reason: str, actor: str) -> CompensationPlan | None:
    """A child run is undone because its parent is compensated: whether it is still in flight
    (it leaves its worker, as when cancelled: fence +1, open approvals expired), completed, or
    failed with effects, it gets its own plan (its effects and its own children, newest first),
    trigger "parent". None if it has one already (it is compensating, or its compensation is
    parked for a person) or cannot (finished otherwise)."""
    with transaction.atomic():
        run = run_lock(run_id=child_id)
        if run.parent_run is None or RunStatus.COMPENSATING not in RUN_TRANSITIONS[run.status]:
            return None
        if CompensationPlan.objects.filter(run=run).exists():
            return None
        approvals_expire_open(run=run, why="its parent is compensating", by=actor)
        plan = plan_create(run=run, reason=reason, trigger="parent", user=None, actor=actor)
        run_move_to_compensating(run=run)
    return plan


def undo_before_fork(ctx: JournalCursor) -> None:
    """A run re-run from another with "compensate first" (``sagas.repair.run_fork``): before
    its workflow goes on, undo the source's effects after the fork point, newest first, each
    through the ledger under ``"<effect key>:compensate"`` with the payload a compensation of
    the source would send, so the source's own compensation, or another re-run's, never undoes
    it twice. Each is journaled on this run as ``compensation_item`` once done.

    An unknown outcome parks this run (``effect_unknown``: the ambiguous-effects queue lists
    the compensation; once resolved, the run resumes and the ledger answers). A compensation
    that fails fails this run (``StepFailed``, step ``compensate:<name>``) before it executed
    anything: nothing after it is undone, never skipped."""
    while ctx.undo_pending:
        item = ctx.undo_pending[0]
        original = EffectRecord.objects.get(id=item["effect_id"])
        op = Operation(get_connector(item["connector"]), "compensation")
        payload = {"effect_id": original.id, "payload": original.request_payload, "result": original.result}
        name = f"compensate:{item['name']}"
        crash_point("before_compensation", item["name"])
        try:
            with tracing.compensation_span(ctx, item["name"], item["connector"], item["key"]):
                record = run_operation(ctx, op, name=name, key=item["key"], payload=payload,
                                       connector_name=item["connector"])
        except OutcomeUnknown as exc:
            raise EffectUnknown(f"compensating {item['name']!r} of the run this one re-runs: {exc.message}",
                                **exc.details) from exc
        except EffectFailed as exc:
            raise StepFailed(name, type(exc).__name__, f"compensating {item['name']!r} of the run this one "
                                                       f"re-runs failed: {exc}; nothing after it was undone") from exc
        ctx.append(K.COMPENSATION_ITEM, name, dumps({"step": item["name"], "state": ItemState.SUCCEEDED,
                                                     "downstream_ref": record.downstream_ref,
                                                     "effect_id": original.id, "of_run": str(original.run_id)}))
        ctx.undo_pending.pop(0)
        send_run_changed(ctx.run_id, RunStatus.RUNNING, cause=K.COMPENSATION_ITEM)


def _item_stuck(
    ctx: JournalCursor, plan: CompensationPlan, item: CompensationItem, state: str, reason: str, message: str
) -> None:
    with transaction.atomic():  # the plan before its item: sagas.store.locks' order
        check_compensation_transition(plan.state, CompensationState.NEEDS_ATTENTION)
        plan.state = CompensationState.NEEDS_ATTENTION
        plan.save(update_fields=["state"])
        item.state = state
        record = EffectRecord.objects.filter(tenant=ctx.tenant, idempotency_key=item.compensation_key).first()
        item.compensation_effect_id = record.id if record else None
        item.save(update_fields=["state", "compensation_effect_id"])
    raise CompensationStuck(
        f"compensating {item.step_name!r} ({item.connector}) "
        f"{'failed' if state == ItemState.FAILED else 'has an unknown outcome'}: "
        f"{message}. Later compensations wait; nothing is skipped.",
        reason=reason, step=item.step_name, connector=item.connector, key=item.compensation_key,
        effect_id=item.compensation_effect_id,
    )


def needs_compensation(run_id: str) -> bool:
    """The run has something a compensation would undo: a succeeded effect, or an attached
    child run in flight or finished with something of its own to undo."""
    if EffectRecord.objects.filter(run_id=run_id, kind=EffectKind.EFFECT, status=EffectStatus.SUCCEEDED).exists():
        return True
    return bool(_children_to_undo(run_id))


def plan_for_failure(ctx: JournalCursor, *, reason: str, trigger: str) -> None:
    """Under the worker's claim: create the plan and switch the run to COMPENSATING (fenced)."""
    with transaction.atomic():
        ctx.check_fence()
        run = WorkflowRun.objects.select_for_update().get(id=ctx.run_id)
        check_transition(run.status, RunStatus.COMPENSATING)
        approvals_expire_open(run=run, why="compensation started")
        plan_create(run=run, reason=reason, trigger=trigger, user=None, actor=ctx.worker_id)
        WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.COMPENSATING, updated_at=timezone.now())
        send_run_changed(run.id, RunStatus.COMPENSATING, cause=K.COMPENSATION_STARTED)


"""Child runs: a run that starts other runs and waits for them, holding no worker.

Inside a workflow (``Context.start_child``, ``wait_child``, ``gather``, ``signal_child``):

* **Start.** ``start_child`` takes the next position, ``child_started`` ``child:<workflow>[#n]``.
  The child's id is ``uuid5(parent id, that name)``: the same call of the same run always
  names the same child. The child's row, its ``started`` entry and the parent's
  ``child_started`` entry are written in one transaction under the parent's fence, so a crash
  leaves either all three or none, and a replay finds the entry and returns the same handle:
  never two children for one call. The child is woken after the commit (a lost wake-up is
  found by the sweeper, as for any PENDING run no queue holds).
* **Finish.** When a child ends (COMPLETED, FAILED, CANCELLED, COMPENSATED), ``child_finished``
  is journaled on its parent with the child's status, result or error and spend, once (under
  the parent's row lock, if not already there), and a WAITING parent becomes PENDING. A run
  that needs a person (NEEDS_ATTENTION) has not ended: its parent goes on waiting.
  If the process dies between the child's end and that report, the parent's next replay (or
  the sweeper, ``children_catch_up``) finds the child ended and reports it then.
* **Join.** ``wait_child``/``gather`` suspend the parent until every child they name has ended
  or one of them has not completed; what they decided is journaled as ``children_joined`` (a
  position), so a replay decides the same even if more children have ended since. A child that
  did not complete raises ``ChildFailed`` (the first one, in the order of the handles).
* **Budget.** A child started without its own ``max_cost`` while the parent has one runs with
  what the parent has left at that moment, and its spend is charged to the parent when the
  parent joins it (the ``cost`` of the ``children_joined`` entry): a budget spent by children
  stops the parent at its next step, as its own spending does.
* **Closing.** A parent that ends (completes, fails, is cancelled, continues as new) cancels
  its children still running, unless they were started ``detached``; a cancel or compensation
  of the parent goes down the tree (``children_cancel``, compensation items per child,
  ``sagas.compensation``). A detached child is on its own from its start: nothing of its
  parent's reaches it, and its end is still reported if the parent waits for it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from sagas.errors import ActionNotAllowed, ChildFailed, InvalidArgument, RunFinished, StartConflict, Suspend
from sagas.events import send_run_changed
from sagas.models import TERMINAL_STATUSES, JournalEntry, JournalKind, RunStatus, WorkflowRun
from sagas.replay.cursor import JournalCursor
from sagas.runtime import queue
from sagas.runtime.crashpoints import crash_point
from sagas.store.locks import run_lock
from sagas.store.systemdb import dumps
from sagas.validation import checked_json, checked_text

log = logging.getLogger("sagas.children")
K = JournalKind

STARTED_VIA = "parent"
# A child's run that did not complete (what ``ChildFailed`` reports).
NOT_COMPLETED = frozenset({RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.COMPENSATED})
# Children a parent still has to close or wait for.
IN_FLIGHT = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION)


@dataclass(frozen=True)
class ChildHandle:
    """What ``ctx.start_child`` returns: the child's run id, its workflow and the call's name."""

    run_id: str
    workflow: str
    call: str
    detached: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "workflow": self.workflow, "call": self.call, "detached": self.detached}


def child_id(parent_id: str, call: str) -> str:
    """The child's run id: the same parent and call always give the same id."""
    return str(uuid.uuid5(uuid.UUID(str(parent_id)), call))


# --- inside a workflow ----------------------------------------------------------------


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
    from sagas.services import priority_check, start_arguments_check, version_sync
    from sagas.summaries import summary_compute
    from sagas.versions import registry

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
    run = ctx._run
    budget_from_parent = max_cost is None and run.max_cost is not None and not detached
    if budget_from_parent:
        left = max(Decimal(run.max_cost) - Decimal(str(ctx.cost_used)), Decimal(0))
        child_cost: Decimal | None = left
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
    ended = {h.call: ctx.recorded_event(K.CHILD_FINISHED, h.call) for h in handles}
    missing = [h for h in handles if ended[h.call] is None]
    if missing and _report_ended(ctx.run_id, missing):
        # An ended child had not been reported (its report was lost): it is journaled now, so
        # suspending is refused (something arrived) and the run replays with it.
        raise Suspend(f"{what}: a child's end was reported late", wake_at=None)
    failed = next((h for h in handles if ended[h.call] is not None
                   and ended[h.call].payload["status"] != RunStatus.COMPLETED), None)
    if failed is None and missing:
        raise Suspend(f"{what}: waiting for {len(missing)} of {len(handles)} child run(s)", wake_at=None)
    cost = sum(float(ended[h.call].payload.get("cost") or 0) for h in handles
               if ended[h.call] is not None and ended[h.call].payload.get("budget") == "parent")
    payload: dict[str, Any] = {"calls": [h.call for h in handles], "failed": failed.call if failed else None}
    if cost:
        payload["cost"] = cost
    ctx.append(K.CHILDREN_JOINED, name, dumps(payload), cost=cost)
    return _joined(ctx, handles, failed.call if failed else None)


def _joined(ctx: JournalCursor, handles: list[ChildHandle], failed: str | None) -> list[Any]:
    if failed is not None:
        h = next(h for h in handles if h.call == failed)
        p = ctx.recorded_event(K.CHILD_FINISHED, failed).payload
        raise ChildFailed(child_run_id=h.run_id, workflow=h.workflow, call=h.call, status=p["status"],
                          error=p.get("error"))
    return [ctx.recorded_event(K.CHILD_FINISHED, h.call).payload.get("result") for h in handles]


def signal_child(ctx: JournalCursor, handle: ChildHandle, name: str, payload: Any = None) -> None:
    """Send signal ``name`` to a child, once: the parent's ``child_signalled`` entry and the
    child's ``signal_received`` are written in one transaction."""
    from sagas.waits import signal_send_locked

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


# --- when a run ends ----------------------------------------------------------------------


def _report_payload(child: WorkflowRun, call: str, budget: str) -> dict[str, Any]:
    return {"run_id": str(child.id), "workflow": child.workflow_name, "status": child.status,
            "result": child.result if child.status == RunStatus.COMPLETED else None,
            "error": child.error if child.status != RunStatus.COMPLETED else None,
            "cost": float(child.cost_used), "budget": budget, "call": call}


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
            reported |= _report(parent_id, child, h.call)
    return reported


def _report(parent_id: str, child: WorkflowRun, call: str) -> bool:
    with transaction.atomic():
        parent = run_lock(run_id=parent_id)
        if JournalEntry.objects.filter(run_id=parent.id, kind=K.CHILD_FINISHED, name=call).exists():
            return False
        started = JournalEntry.objects.filter(run_id=parent.id, kind=K.CHILD_STARTED, name=call).values_list(
            "payload", flat=True).first()
        budget = (started or {}).get("budget", "own")
        from sagas.waits import wake_locked

        wake_locked(parent, kind=K.CHILD_FINISHED, name=call, payload=_report_payload(child, call, budget),
                    actor=f"child {child.id}")
        if parent.status == RunStatus.COMPENSATING and parent.lease_expires_at is None:
            # A compensation waiting for this child to be undone, handed back: go on with it.
            queue.enqueue_after_commit(parent.id, parent.definition_hash, compensating=True,
                                       priority=parent.priority)
    return True


def _parent_call(child: WorkflowRun) -> str | None:
    started = JournalEntry.objects.filter(run_id=child.id, seq=1).values_list("payload", flat=True).first()
    parent = (started or {}).get("parent") or {}
    return parent.get("call")


def after_end(run_id: Any) -> None:
    """A run has ended (committed): report it to its parent, and cancel its own children still
    in flight that were not started detached. Both are safe to repeat; the sweeper repeats
    them for runs whose process died first (``children_catch_up``)."""
    in_flight = WorkflowRun.objects.filter(parent_run=OuterRef("id"), detached=False, status__in=IN_FLIGHT)
    run = WorkflowRun.objects.annotate(open_children=Exists(in_flight)).filter(id=run_id).first()
    if run is None or run.status not in TERMINAL_STATUSES:
        return
    if run.parent_run is not None and run.status_reason != "continued_as_new":
        call = _parent_call(run)
        if call is not None and WorkflowRun.objects.filter(id=run.parent_run).exists():
            _report(str(run.parent_run), run, call)
    if run.open_children:
        children_cancel(parent=run, actor="system", reason=f"its parent run {run.id} ended {run.status}",
                        compensate=False)


def children_cancel(*, parent: WorkflowRun, actor: str, reason: str, compensate: bool) -> int:
    """Cancel ``parent``'s attached children still in flight (and theirs, down the tree);
    with ``compensate``, each undoes what it did. Returns how many were cancelled. Locks
    each child after its parent (``sagas.store.locks``: a tree is locked from the top)."""
    from sagas.services import run_cancel

    cancelled = 0
    ids = list(WorkflowRun.objects.filter(parent_run=parent.id, detached=False, status__in=IN_FLIGHT)
               .order_by("created_at").values_list("id", flat=True))
    for cid in ids:
        try:
            run_cancel(run_id=str(cid), user=None, reason=reason, compensate=compensate, actor=actor)
        except (RunFinished, ActionNotAllowed):
            continue  # it ended, or is compensating, meanwhile
        cancelled += 1
    return cancelled


_WAITING_ON_ENDED_SQL = """
SELECT c.id FROM sagas_workflowrun p JOIN sagas_workflowrun c ON c.parent_run = p.id
 WHERE p.status = 'WAITING' AND p.wake_at IS NULL AND p.updated_at < now() - make_interval(secs => %(grace)s)
   AND c.status = ANY(%(terminal)s) AND c.status_reason <> 'continued_as_new'
   AND c.finished_at > p.updated_at AND c.finished_at < now() - make_interval(secs => %(grace)s)
 LIMIT %(limit)s
"""

_ORPHANS_SQL = """
SELECT DISTINCT c.parent_run FROM sagas_workflowrun c
 WHERE c.parent_run IS NOT NULL AND NOT c.detached AND c.status = ANY(%(in_flight)s)
   AND EXISTS (SELECT 1 FROM sagas_workflowrun p WHERE p.id = c.parent_run AND p.status = ANY(%(terminal)s)
                 AND p.finished_at < now() - make_interval(secs => %(grace)s))
 LIMIT %(limit)s
"""


def children_catch_up(*, limit: int = 500) -> int:
    """The sweeper's pass, for what a process that died left undone (see the module):

    * a parent waiting for children (WAITING, no deadline) that has a child which ended after
      the parent went waiting and was not reported (its end, older than the grace, would have
      woken it): the end is reported now, which wakes it;
    * attached children still in flight under a parent that ended: cancelled now.

    Both queries go through partial indexes (``run_wake_due``, ``run_children_in_flight``), so a
    pass costs little when nothing is wrong. Returns the runs acted on."""
    from django.conf import settings
    from django.db import connection

    grace = max(1.0, 2 * float(settings.SAGAS_SWEEP_INTERVAL))
    params = {"grace": grace, "terminal": sorted(TERMINAL_STATUSES), "in_flight": sorted(IN_FLIGHT),
              "limit": limit}
    with connection.cursor() as cur:
        cur.execute(_WAITING_ON_ENDED_SQL, params)
        ended = [row[0] for row in cur.fetchall()]
        cur.execute(_ORPHANS_SQL, params)
        orphaned = [row[0] for row in cur.fetchall()]
    for run_id in ended + orphaned:
        after_end(run_id)
    return len(ended) + len(orphaned)

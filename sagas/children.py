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
  its children still running, unless they were started ``detached``
  (``sagas.services.tree_after_end``); a compensation of the parent goes down the tree, one item
  per child (``sagas.compensation``). A detached child is on its own from its start: nothing of
  its parent's reaches it, and its end is still reported if the parent waits for it.

Modules: this one holds the handle, the ids and the report of a child's end to its parent;
``sagas.replay.children`` the calls a workflow makes; ``sagas.services`` what happens to a tree
when a run in it ends or is cancelled, and the sweeper's catch-up.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from sagas.models import JournalEntry, JournalKind, RunStatus, WorkflowRun
from sagas.runtime import queue
from sagas.store.systemdb import append_event, dumps
from sagas.waits import wake_locked

log = logging.getLogger("sagas.children")
K = JournalKind

STARTED_VIA = "parent"
# A parent WAITING in a join that awaits every attached child still in flight: a child's end
# wakes it only when it is the last of them, or did not complete (``report_to_parent``).
AWAITING_CHILDREN = "awaiting_children"
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


def _report_payload(child: WorkflowRun, call: str, budget: str) -> dict[str, Any]:
    return {"run_id": str(child.id), "workflow": child.workflow_name, "status": child.status,
            "result": child.result if child.status == RunStatus.COMPLETED else None,
            "error": child.error if child.status != RunStatus.COMPLETED else None,
            "cost": float(child.cost_used), "budget": budget, "call": call}


def report_to_parent(parent_id: str, child: WorkflowRun, call: str) -> bool:
    """Journal ``child``'s end on its parent (``call``: the parent's name for it), once, under the
    parent's row lock; wake the parent if its wait may end. True if it was journaled now."""
    with transaction.atomic():
        parent = WorkflowRun.objects.select_for_update().filter(id=parent_id).first()
        if parent is None:
            return False  # archived: nobody waits any more
        mine = JournalEntry.objects.filter(run_id=parent.id, kind__in=[K.CHILD_STARTED, K.CHILD_FINISHED], name=call)
        entries = dict(mine.values_list("kind", "payload"))
        if K.CHILD_FINISHED in entries:
            return False
        budget = (entries.get(K.CHILD_STARTED) or {}).get("budget", "own")
        payload = _report_payload(child, call, budget)
        if (parent.status == RunStatus.WAITING and parent.status_reason == AWAITING_CHILDREN
                and child.status == RunStatus.COMPLETED and _siblings_in_flight(parent)):
            # Not the last child its join waits for: journaled, and the parent sleeps on.
            append_event(str(parent.id), kind=K.CHILD_FINISHED, name=call, payload=dumps(payload),
                         worker=f"child {child.id}")
            return True
        wake_locked(parent, kind=K.CHILD_FINISHED, name=call, payload=payload, actor=f"child {child.id}")
        if parent.status == RunStatus.COMPENSATING and parent.lease_expires_at is None:
            # A compensation waiting for this child to be undone, handed back: go on with it.
            queue.enqueue_after_commit(parent.id, parent.definition_hash, compensating=True,
                                       priority=parent.priority)
    return True


def _siblings_in_flight(parent: WorkflowRun) -> bool:
    return WorkflowRun.objects.filter(parent_run=parent.id, detached=False, status__in=IN_FLIGHT).exists()


def _parent_call(child: WorkflowRun) -> str | None:
    started = JournalEntry.objects.filter(run_id=child.id, seq=1).values_list("payload", flat=True).first()
    parent = (started or {}).get("parent") or {}
    return parent.get("call")


def report_end(run: WorkflowRun) -> None:
    """``run`` (terminal, committed) is a child: journal its end on its parent, once."""
    if run.parent_run is None or run.status_reason == "continued_as_new":
        return
    call = _parent_call(run)
    if call is not None:
        report_to_parent(str(run.parent_run), run, call)

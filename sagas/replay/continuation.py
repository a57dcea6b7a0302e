"""Continue-as-new: a run ends by handing its loop to a fresh run of the same workflow.

``ctx.continue_as_new(state)`` raises ``ContinueAsNew``; the engine catches it and calls
``continue_claimed``. Runs linked this way form a chain: ``continued_from`` and
``continued_to`` on each run (plain ids), and the chain's first run and each run's position
in the ``chain`` object of its ``started`` journal entry (so a position is known even after
retention has archived the chain's older runs).

Guarantees:

* One transaction, under the continuing worker's fence: the old run becomes COMPLETED
  (``status_reason`` and journal kind ``continued_as_new``, result ``{"continued_as": id}``,
  ``continued_to`` set) and its successor is created PENDING with its ``started`` entry.
  Either both happen or neither does: a crash before the commit leaves no successor and the
  old run replays to the same call (its lease runs out first); after the commit the old run
  is terminal, so it is never replayed and never continues twice.
* The successor is woken after the commit. A wake-up lost to a crash or to Redis is found by
  the sweeper, as for any run that no queue holds.
* If something was journaled since the worker loaded the run (a signal, a decision), nothing
  is done and the caller replays with it, as a suspension does.

Decisions (see ``Context.continue_as_new``): the successor runs the newest registered version;
budgets and ``started_at`` are the chain's; business key ``<first key>#<position>``.

Crash points (``sagas.runtime.crashpoints``): ``continue_as_new_uncommitted`` (inside the transaction,
the old run finished but the successor not yet inserted) and ``after_continue_as_new``
(committed, successor not yet woken).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from sagas.errors import LeaseLost
from sagas.events import send_run_changed
from sagas.models import JournalEntry, JournalKind, RunStatus, WorkflowRun
from sagas.runtime import queue
from sagas.runtime.crashpoints import crash_point
from sagas.services import version_sync
from sagas.store.systemdb import ClaimedRun, finish
from sagas.summaries import summary_compute
from sagas.validation import BUSINESS_KEY_CHARS
from sagas.versions import registry

log = logging.getLogger("sagas.replay.continuation")

# The old run's status_reason and the journal kind of its last entry.
CONTINUED_AS_NEW = "continued_as_new"
# The successor's started_via.
STARTED_VIA = "continue_as_new"


@dataclass(frozen=True)
class ChainPlace:
    """Where a run stands in its chain, as its ``started`` entry recorded it."""

    first: str  # the chain's first run
    position: int  # 1 for the first run
    business_key: str  # the first run's business key (the chain's own)

    def as_dict(self) -> dict[str, Any]:
        return {"first": self.first, "position": self.position, "business_key": self.business_key}


def chain_place(run_id: str | uuid.UUID, *, business_key: str = "", started: Any = None) -> ChainPlace:
    """The run's place in its chain, from its ``started`` entry's payload (``started``, or
    read); a run that continues nothing is the first of its own chain."""
    if started is None:
        first = JournalEntry.objects.filter(run_id=uuid.UUID(str(run_id)), seq=1)
        started = first.values_list("payload", flat=True).first()
    chain = started.get("chain") if isinstance(started, dict) else None
    if isinstance(chain, dict) and chain.get("first") and isinstance(chain.get("position"), int):
        return ChainPlace(str(chain["first"]), chain["position"], str(chain.get("business_key") or ""))
    return ChainPlace(str(run_id), 1, business_key)


def _chain_key(base: str, position: int) -> str:
    if not base:
        return ""
    suffix = f"#{position}"
    return base[: BUSINESS_KEY_CHARS - len(suffix)] + suffix


def _parent_of(run_id: str) -> Any:
    first = JournalEntry.objects.filter(run_id=uuid.UUID(str(run_id)), seq=1)
    started = first.values_list("payload", flat=True).first()
    return (started or {}).get("parent")


def continue_claimed(run: ClaimedRun, *, owner: str, expect_last_seq: int, state: Any) -> str | None:
    """Finish the claimed ``run`` as continued and create its successor with ``state`` as input
    (one transaction, see the module); wake the successor after the commit. Returns the
    successor's id, or None when something was journaled since ``expect_last_seq`` (nothing
    was written: the caller replays). Raises ``LeaseLost`` when the fence moved on."""
    definition = registry.get(run.workflow_name)  # the newest version this worker has
    version_sync(definition=definition)  # before the transaction: it caches what it wrote
    summary = summary_compute(definition.summary, state, workflow=definition.name, version=definition.version)
    new_id = str(uuid.uuid4())
    with transaction.atomic():
        seq = finish(
            run.id, fence=run.fence, status=RunStatus.COMPLETED, kind=CONTINUED_AS_NEW, worker=owner,
            payload={"continued_as": new_id, "workflow": definition.name, "version": definition.version},
            reason=CONTINUED_AS_NEW, result={"continued_as": new_id}, terminal=True,
            expect_last_seq=expect_last_seq,
        )
        if seq is None:
            return None  # a signal or decision arrived: replay with it
        linked = WorkflowRun.objects.filter(id=run.id, continued_to__isnull=True).update(continued_to=new_id)
        if linked != 1:  # cannot happen while the fence held; refuse rather than fork the chain
            raise LeaseLost(f"run {run.id} already continues as another run")
        old = WorkflowRun.objects.values(
            "business_key", "steps_used", "cost_used", "max_steps", "max_cost", "max_duration", "started_at",
            "created_at", "started_by_id", "started_by__username", "parent_run", "detached",
        ).get(id=run.id)
        place = chain_place(run.id, business_key=old["business_key"])
        crash_point("continue_as_new_uncommitted", run.workflow_name)
        successor = ChainPlace(place.first, place.position + 1, place.business_key)
        fields: dict[str, Any] = dict(
            id=new_id, workflow_name=definition.name, version=definition.version,
            definition_hash=definition.definition_hash, input=state, summary=summary, tenant=run.tenant,
            status=RunStatus.PENDING, last_seq=1,
            # The chain's budget: counters go on from the old run's, limits stay, and the
            # duration counts from the chain's first start (the claim keeps a set started_at).
            steps_used=old["steps_used"], cost_used=old["cost_used"], max_steps=old["max_steps"],
            max_cost=old["max_cost"], max_duration=old["max_duration"],
            started_at=old["started_at"] or old["created_at"],
            started_by_id=old["started_by_id"], started_via=STARTED_VIA, continued_from=run.id,
            priority=run.priority,  # the chain keeps its place
            # A child's chain stays its parent's child (sagas.children): the parent waits for its end.
            parent_run=old["parent_run"], detached=old["detached"],
        )
        business_key = _chain_key(successor.business_key, successor.position)
        if business_key:
            try:
                with transaction.atomic():  # a savepoint: the key may be taken by a run started by hand
                    WorkflowRun.objects.create(business_key=business_key, **fields)
            except IntegrityError:
                log.warning("run %s: business key %r is taken; its successor has none", run.id, business_key)
                business_key = ""
        if not business_key:
            WorkflowRun.objects.create(business_key="", **fields)
        JournalEntry.objects.create(
            run_id=new_id, seq=1, kind=JournalKind.STARTED, worker_id=owner, created_at=timezone.now(),
            payload={
                "input": state, "version": definition.version, "definition_hash": definition.definition_hash,
                "business_key": business_key, "tenant": run.tenant, "started_by": old["started_by__username"],
                "started_via": STARTED_VIA, "continued_from": run.id, "chain": successor.as_dict(),
                **({"parent": _parent_of(run.id)} if old["parent_run"] else {}),
            },
        )
    crash_point("after_continue_as_new", run.workflow_name)
    log.info("run %s: continued as %s (run %d of its chain)", run.id, new_id, successor.position)
    queue.enqueue_advance(new_id, definition.definition_hash, priority=run.priority)
    send_run_changed(new_id, RunStatus.PENDING, cause=JournalKind.STARTED)
    return new_id

"""Writes on runs outside a worker's claim: starting, parking and resuming runs; versions;
workers; cancelling and retrying. How a ledger resolution reaches its run is
``sagas.resolutions``'."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from sagas import children, selectors
from sagas.compensation import approvals_expire_open, needs_compensation, plan_create, run_move_to_compensating
from sagas.errors import ActionNotAllowed, RunFinished, StartConflict
from sagas.events import send_run_changed
from sagas.models import (
    LEASED_STATUSES,
    TERMINAL_STATUSES,
    CompensationItemState,
    CompensationPlan,
    CompensationState,
    JournalKind,
    RunStatus,
    WorkerProcess,
    WorkflowRun,
    WorkflowVersion,
    check_transition,
)
from sagas.runtime import queue
from sagas.store import startdb, systemdb
from sagas.store.locks import run_lock
from sagas.store.systemdb import dumps
from sagas.summaries import summary_compute
from sagas.validation import (
    FREE_TEXT_CHARS,
    checked_text,
    priority_check,
    start_arguments_check,
    start_name_check,
)
from sagas.versions import registry

log = logging.getLogger("sagas.services")

_synced_versions: set[tuple[str, int, str]] = set()


def version_sync(*, definition: registry.WorkflowDefinition) -> None:
    """Record ``(name, version, hash)`` and its source; a no-op after the first call per process."""
    key = (definition.name, definition.version, definition.definition_hash)
    if key in _synced_versions:
        return
    with connection.cursor() as cur:
        cur.execute(
            """INSERT INTO sagas_workflowversion
                   (name, version, definition_hash, source, module, first_registered_at, last_registered_at)
               VALUES (%s, %s, %s, %s, %s, now(), now())
               ON CONFLICT (name, version, definition_hash)
               DO UPDATE SET last_registered_at = now(), module = EXCLUDED.module""",
            [definition.name, definition.version, definition.definition_hash, definition.source, definition.module],
        )
    _synced_versions.add(key)


def versions_sync_all() -> int:
    definitions = registry.all_definitions()
    for definition in definitions:
        version_sync(definition=definition)
    return len(definitions)


def run_start(
    *,
    name: str,
    input: Any = None,
    business_key: str = "",
    tenant: str = "default",
    version: int | None = None,
    started_by: User | None = None,
    started_via: str = "api",
    max_steps: int | None = None,
    max_cost: float | None = None,
    max_duration: timedelta | None = None,
    priority: int | None = None,
) -> WorkflowRun:
    """Create a PENDING run and its ``started`` journal entry (one statement,
    ``sagas.store.startdb.insert_run``) and wake a worker for it after commit.

    Every argument is checked before the database is touched (``sagas.validation``:
    ``InvalidArgument``, ``NotSerializable``). Idempotent per ``(tenant, name,
    business_key)``: starting again with the same input returns the existing run; with a
    different input, or naming another ``version`` than the existing run's, raises
    ``StartConflict`` and creates nothing. Budgets default to the workflow's.
    """
    start_name_check(name, version)
    definition = registry.get(name, version)
    checked = start_arguments_check(
        input=input, business_key=business_key, tenant=tenant, started_by=started_by, started_via=started_via,
        max_steps=max_steps, max_cost=max_cost, max_duration=max_duration,
    )
    input = checked.input
    run_priority = definition.priority if priority is None else priority_check(priority)
    summary = summary_compute(definition.summary, input, workflow=definition.name, version=definition.version)
    version_sync(definition=definition)
    budget_steps = max_steps if max_steps is not None else definition.max_steps
    budget_cost = checked.max_cost if max_cost is not None else definition.max_cost
    budget_duration = max_duration if max_duration is not None else definition.max_duration
    run_id = uuid.uuid4()
    max_cost_value = Decimal(str(budget_cost)) if budget_cost is not None else None
    created_at = startdb.insert_run(
        str(run_id), workflow_name=definition.name, version=definition.version,
        definition_hash=definition.definition_hash, input=dumps(input) if input is not None else None,
        summary=dumps(summary) if summary is not None else None, business_key=business_key, tenant=tenant,
        max_steps=budget_steps, max_cost=max_cost_value, max_duration=budget_duration,
        started_by_id=started_by.pk if started_by is not None else None,
        started_by_name=started_by.get_username() if started_by is not None else None, started_via=started_via,
        priority=run_priority,
    )
    if created_at is None:  # the business key is taken: that run, if it is the same start
        existing = WorkflowRun.objects.get(tenant=tenant, workflow_name=definition.name, business_key=business_key)
        if existing.input != input:
            raise StartConflict(
                f"{definition.name} run {existing.id} already exists for business key {business_key!r} "
                f"(tenant {tenant!r}) with a different input; nothing was started"
            )
        if version is not None and existing.version != version:
            raise StartConflict(
                f"{definition.name} run {existing.id} already exists for business key {business_key!r} "
                f"(tenant {tenant!r}) at version {existing.version}, not the version {version} asked for; "
                f"nothing was started"
            )
        existing.created_now = False  # for callers that answer "created" and "already there" apart
        return existing
    # The row as inserted, without reading it back (as if loaded: saving it updates it).
    inserted = WorkflowRun(
        id=run_id, workflow_name=definition.name, version=definition.version,
        definition_hash=definition.definition_hash, input=input, summary=summary, business_key=business_key,
        tenant=tenant, status=RunStatus.PENDING, last_seq=1, max_steps=budget_steps, max_cost=max_cost_value,
        max_duration=budget_duration, started_by=started_by, started_via=started_via, created_at=created_at,
        updated_at=created_at, priority=run_priority,
    )
    names = [f.attname for f in WorkflowRun._meta.concrete_fields]
    run = WorkflowRun.from_db(connection.alias, names, [getattr(inserted, name) for name in names])
    if started_by is not None:
        run.started_by = started_by
    # After commit (at once in autocommit, where the statement committed itself).
    queue.enqueue_new_run_after_commit(run.id, run.definition_hash, priority=run.priority)
    send_run_changed(run.id, RunStatus.PENDING, cause=JournalKind.STARTED)
    run.created_now = True
    return run


def runs_resume_stranded(*, hashes: set[str]) -> list[str]:
    """Runs parked for ``version_mismatch`` whose definition hash is in ``hashes`` (some
    live worker has their exact code again) go back to PENDING, routed to that code."""
    if not hashes:
        return []
    resumed: list[str] = []
    candidates = WorkflowRun.objects.filter(
        status=RunStatus.NEEDS_ATTENTION, status_reason="version_mismatch", definition_hash__in=hashes
    ).values_list("id", flat=True)
    for run_id in candidates:
        with transaction.atomic():
            run = WorkflowRun.objects.select_for_update().get(id=run_id)
            if run.status != RunStatus.NEEDS_ATTENTION or run.status_reason != "version_mismatch":
                continue
            check_transition(run.status, RunStatus.PENDING)
            run.last_seq = systemdb.append_event(
                str(run.id), kind=JournalKind.RESUMED, name="", worker="",
                payload=dumps(
                    {"reason": "a worker has this code version again", "definition_hash": run.definition_hash}
                ),
            )
            run.status, run.status_reason, run.error = RunStatus.PENDING, "", None
            run.save(update_fields=["status", "status_reason", "error", "updated_at"])
            queue.enqueue_after_commit(run.id, run.definition_hash, priority=run.priority)
            send_run_changed(run.id, RunStatus.PENDING, cause=JournalKind.RESUMED)
        resumed.append(str(run_id))
    if resumed:
        log.info("resumed %d run(s) stranded by a version mismatch", len(resumed))
    return resumed


def run_park_unroutable(*, run_id: str, live_hashes: set[str]) -> bool:
    """Park a run that no live worker has the code for (NEEDS_ATTENTION, version_mismatch).

    Applies to PENDING runs and to runs whose lease expired; bumps the fence so a
    worker that comes back from the dead cannot write. Returns False when the run
    moved on meanwhile (claimed, finished) and nothing was changed.
    """
    with transaction.atomic():
        run = WorkflowRun.objects.select_for_update().get(id=run_id)
        leased_out = run.status in LEASED_STATUSES and run.lease_expires_at and run.lease_expires_at < timezone.now()
        if run.status == RunStatus.COMPENSATING:
            return False  # needs no workflow code: any worker compensates it
        if not (run.status == RunStatus.PENDING or leased_out) or run.definition_hash in live_hashes:
            return False
        check_transition(run.status, RunStatus.NEEDS_ATTENTION)
        known = sorted(
            WorkflowVersion.objects.filter(name=run.workflow_name, version=run.version, definition_hash__in=live_hashes)
            .values_list("definition_hash", flat=True)
        )
        error = {
            "code": "version_mismatch",
            "message": (
                f"no live worker has the code this run started with ({run.workflow_name} v{run.version}, "
                f"hash {run.definition_hash[:12]})"
                + (f"; live workers have {', '.join(h[:12] for h in known)} for this version" if known else "")
                + ". Deploy a worker with that code to resume it, or cancel or compensate it."
            ),
            "run_hash": run.definition_hash,
            "live_hashes_for_version": known,
        }
        # Numbered after any steps the expired holder journaled, and counting them.
        run.last_seq = systemdb.append_event(
            str(run.id), kind=JournalKind.HALTED, name="", payload=dumps(error), worker="sweeper"
        )
        run.status, run.status_reason, run.error = RunStatus.NEEDS_ATTENTION, "version_mismatch", error
        run.fence += 1
        run.lease_owner, run.lease_expires_at = "", None
        run.save(
            update_fields=["status", "status_reason", "error", "fence", "lease_owner", "lease_expires_at", "updated_at"]
        )
        send_run_changed(run.id, RunStatus.NEEDS_ATTENTION, cause=JournalKind.HALTED)
    log.warning("run %s: parked, %s", run_id, error["message"])
    return True


def worker_beat(*, name: str, hostname: str, pid: int, started_at: datetime) -> None:
    """Upsert this worker's registry row with the definitions it runs."""
    definitions = [  # the legacy hash too: the sweeper routes runs started before the upgrade here
        {"name": d.name, "version": d.version, "hash": h}
        for d in registry.all_definitions() for h in sorted(d.accepted_hashes)
    ]
    now = timezone.now()
    with transaction.atomic():
        # Holding the row: a goodbye (``worker_stopped``) comes wholly before or after this beat.
        row = WorkerProcess.objects.select_for_update().filter(name=name).first()
        if row is not None and row.started_at == started_at and row.stopped_at is not None:
            # This process said goodbye while a last beat was on its way: the beat must not mark
            # a stopped worker alive again. A restart has a new started_at.
            return
        fields = {"hostname": hostname, "pid": pid, "definitions": definitions, "started_at": started_at,
                  "last_seen_at": now, "stopped_at": None}
        if row is None:
            WorkerProcess.objects.create(name=name, **fields)
            return
        for field, value in fields.items():  # the row read (and locked) above: no second read
            setattr(row, field, value)
        row.save(update_fields=list(fields))


def worker_stopped(*, name: str) -> None:
    WorkerProcess.objects.filter(name=name).update(stopped_at=timezone.now(), last_seen_at=timezone.now())


def run_cancel(*, run_id: str, user: User | None, reason: str, compensate: bool, actor: str = "") -> WorkflowRun:
    """Cancel a run. The fence moves on, so a worker advancing it stops at its next step
    boundary (its write is refused); a waiting run stops at once. With ``compensate`` and
    effects to undo, the run goes COMPENSATING instead of CANCELLED. Open approvals expire.

    Its child runs (``sagas.children``) go with it, detached ones excepted: without
    ``compensate`` those still in flight are cancelled as they are; with it, the run's plan
    stops and undoes each child, newest first with the run's own effects.

    Locks in ``sagas.store.locks``' order: the run, its approvals, then the plan it creates;
    children after their parent."""
    actor = actor or (user.get_username() if user is not None else "system")
    checked_text(reason, what="reason", max_length=FREE_TEXT_CHARS)
    if not reason.strip():
        raise ActionNotAllowed("a reason is required to cancel a run")
    with transaction.atomic():
        run = run_lock(run_id=run_id)
        if run.status in TERMINAL_STATUSES:
            raise RunFinished(f"run {run.id} is already {run.status}")
        if run.status == RunStatus.COMPENSATING:
            raise ActionNotAllowed(f"run {run.id} is compensating; it cannot be cancelled now")
        systemdb.append_event(
            str(run.id), kind=JournalKind.CANCELLED, name="", worker=actor,
            payload=dumps({"by": actor, "reason": reason, "compensate": compensate, "previous_status": run.status}),
        )
        approvals_expire_open(run=run, why="run cancelled", by=actor)
        if compensate and needs_compensation(str(run.id)):
            check_transition(run.status, RunStatus.COMPENSATING)
            plan_create(run=run, reason=f"cancelled: {reason}", trigger="cancel", user=user, actor=actor)
            run_move_to_compensating(run=run)
        else:
            check_transition(run.status, RunStatus.CANCELLED)
            WorkflowRun.objects.filter(id=run.id).update(
                status=RunStatus.CANCELLED, status_reason="cancelled", fence=run.fence + 1, lease_owner="",
                lease_expires_at=None, wake_at=None, finished_at=timezone.now(), updated_at=timezone.now(),
                error={"code": "cancelled", "message": f"cancelled by {actor}: {reason}"},
            )
            send_run_changed(run.id, RunStatus.CANCELLED, cause=JournalKind.CANCELLED)
            children_cancel(parent=run, actor=actor,
                            reason=f"its parent run {run.id} was cancelled by {actor}: {reason}")
    tree_after_end(run.id)  # a child cancelled: its parent hears of it
    run.refresh_from_db()
    return run


def run_retry(*, run_id: str, user: User | None, reason: str) -> WorkflowRun:
    """Let a run parked in NEEDS_ATTENTION go on, where retrying is meaningful:

    * ``budget_exceeded``: the exhausted limit is raised by its original size, recorded;
    * ``version_mismatch``: only if a live worker has the run's exact code again;
    * ``compensation_failed``: failed compensation items are retried under a new key
      (the failed attempt is known not to have executed);
    * ``model_unavailable``: an agent's model request is sent again (same key);
    * ``journal_gap``: a failover lost journal entries; the replay goes on from the journal the
      database has, the effects in the gap UNKNOWN (``sagas.gaps``).

    Other reasons have their own action (resolve the effect, decide the approval) or none
    (non-determinism: deploy the fix as a new version, then cancel or compensate).
    """
    actor = user.get_username() if user is not None else "system"
    checked_text(reason, what="reason", max_length=FREE_TEXT_CHARS)
    with transaction.atomic():
        run = run_lock(run_id=run_id)  # then its plan: sagas.store.locks' order
        if run.status != RunStatus.NEEDS_ATTENTION:
            raise ActionNotAllowed(f"only a run that needs attention can be retried; this one is {run.status}")
        target = RunStatus.PENDING
        details: dict[str, list[Any]] = {}
        if run.status_reason == "budget_exceeded":
            budget = (run.error or {}).get("budget")
            if budget == "steps" and run.max_steps:
                details = {"max_steps": [run.max_steps, run.steps_used + run.max_steps]}
                run.max_steps = run.steps_used + run.max_steps
            elif budget == "cost" and run.max_cost is not None:
                new = run.cost_used + run.max_cost
                details = {"max_cost": [str(run.max_cost), str(new)]}
                run.max_cost = new
            elif budget == "duration" and run.max_duration is not None:
                duration = (timezone.now() - (run.started_at or run.created_at)) + run.max_duration
                details = {"max_duration_s": [run.max_duration.total_seconds(), round(duration.total_seconds(), 3)]}
                run.max_duration = duration
        elif run.status_reason == "version_mismatch":
            live = selectors.live_definition_hashes() or set()
            if run.definition_hash not in live:
                raise ActionNotAllowed(
                    "no live worker has this run's code; deploy a worker with it (the run then resumes by "
                    "itself), or cancel or compensate the run"
                )
        elif run.status_reason == "model_unavailable":
            pass  # the turn was not journaled: the run asks the model again, under the same key
        elif run.status_reason == "journal_gap":
            # A failover lost entries (sagas.gaps): the replay runs the lost steps again and asks
            # each effect again under its key; those the gap hid are UNKNOWN until settled.
            pass
        elif run.status_reason == "compensation_failed":
            plan = CompensationPlan.objects.select_for_update().get(run=run)
            failed = list(plan.items.filter(state=CompensationItemState.FAILED))
            for item in failed:
                base, _, n = item.compensation_key.partition("#")
                item.compensation_key = f"{base}#{int(n or 1) + 1}"
                item.state = CompensationItemState.PENDING
                item.save(update_fields=["compensation_key", "state"])
            plan.state = CompensationState.RUNNING
            plan.save(update_fields=["state"])
            details = {"retried_items": [i.step_name for i in failed]}
            target = RunStatus.COMPENSATING
        else:
            raise ActionNotAllowed(
                f"a run stopped for {run.status_reason or 'this reason'} cannot simply be retried: "
                + {
                    "effect_unknown": "resolve its unknown effect (it then resumes by itself)",
                    "compensation_unknown": "resolve the unknown compensation (it then resumes by itself)",
                    "approval_escalated": "approve or reject the escalated approval",
                    "non_determinism": "deploy the fix as a new version, then cancel or compensate this run",
                }.get(run.status_reason, "cancel or compensate it")
            )
        check_transition(run.status, target)
        systemdb.append_event(str(run.id), kind=JournalKind.OPERATOR_ACTION, name="retry", worker=actor,
                              payload=dumps({"action": "retry", "by": actor, "reason": reason,
                                             "was": run.status_reason, **details}))
        run.status, run.status_reason, run.error = target, "", None
        run.save(update_fields=["status", "status_reason", "error", "max_steps", "max_cost", "max_duration",
                                "updated_at"])
        queue.enqueue_after_commit(run.id, run.definition_hash, compensating=target == RunStatus.COMPENSATING,
                                   priority=run.priority)
        send_run_changed(run.id, target, cause=JournalKind.OPERATOR_ACTION)
    return run


# --- trees of runs (sagas.children) ---------------------------------------------------------


def tree_after_end(run_id: Any) -> None:
    """A run has ended (committed): report it to its parent, and cancel its own children still
    in flight that were not started detached. Both are safe to repeat; the sweeper repeats
    them for runs whose process died first (``children_catch_up``)."""
    in_flight = WorkflowRun.objects.filter(parent_run=OuterRef("id"), detached=False, status__in=children.IN_FLIGHT)
    run = WorkflowRun.objects.annotate(open_children=Exists(in_flight)).filter(id=run_id).first()
    if run is None or run.status not in TERMINAL_STATUSES:
        return
    children.report_end(run)
    if run.open_children:
        children_cancel(parent=run, actor="system", reason=f"its parent run {run.id} ended {run.status}")


def children_cancel(*, parent: WorkflowRun, actor: str, reason: str) -> int:
    """Cancel ``parent``'s attached children still in flight (and theirs, down the tree), as
    they are (a compensation of the parent undoes them through its plan instead). Returns how
    many were cancelled. Locks each child after its parent (``sagas.store.locks``)."""
    cancelled = 0
    ids = list(WorkflowRun.objects.filter(parent_run=parent.id, detached=False, status__in=children.IN_FLIGHT)
               .order_by("created_at").values_list("id", flat=True))
    for cid in ids:
        try:
            run_cancel(run_id=str(cid), user=None, reason=reason, compensate=False, actor=actor)
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
    grace = max(1.0, 2 * float(settings.SAGAS_SWEEP_INTERVAL))
    params: dict[str, Any] = {"grace": grace, "terminal": sorted(TERMINAL_STATUSES),
                              "in_flight": sorted(children.IN_FLIGHT), "limit": limit}
    with connection.cursor() as cur:
        cur.execute(_WAITING_ON_ENDED_SQL, params)
        ended = [row[0] for row in cur.fetchall()]
        cur.execute(_ORPHANS_SQL, params)
        orphaned = [row[0] for row in cur.fetchall()]
    for run_id in ended + orphaned:
        tree_after_end(run_id)
    return len(ended) + len(orphaned)

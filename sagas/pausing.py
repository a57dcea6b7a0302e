"""Pause and resume: hold one run, or every run of a workflow (or of one of its versions),
while someone investigates; then let it go on exactly where it stopped.

A paused run is not claimed (the claim's SQL refuses it), not woken by its timers, and not
re-queued by the sweeper. A worker advancing it when the pause is set finishes the step in
flight, records it, and hands the run back at the next step boundary (journaled ``yielded``,
"paused by an operator"): every journal write and lease renewal reports the pause. Signals,
approval decisions and effect resolutions that arrive meanwhile are recorded as usual; the
run acts on them once resumed. Timers and deadlines that fall due during the pause fire at
resume (``timer_fired`` says how late). Cancel and compensate stay possible on a paused run;
a compensation of a paused run waits for the resume too, like everything else it would do.

A run's own pause is journaled on the run (``operator_action`` "pause" / "resume"). A
workflow's pause is a ``WorkflowPause`` row: it holds new runs of that workflow as well,
and each run's page names it; it is not copied into each run's journal (a workflow may have a
million runs). The console and the HTTP API audit both (``operators.services.runs``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.utils import timezone

from sagas.errors import ActionNotAllowed, InvalidArgument, RunFinished
from sagas.events import send_run_changed
from sagas.models import (
    LEASED_STATUSES,
    TERMINAL_STATUSES,
    JournalEntry,
    JournalKind,
    RunStatus,
    WorkflowPause,
    WorkflowRun,
    WorkflowVersion,
)
from sagas.runtime import queue
from sagas.store import systemdb
from sagas.store.locks import run_lock
from sagas.store.systemdb import dumps
from sagas.validation import actor_label, checked_text, required_reason
from sagas.waits import run_wake_if_due

RELEASE_BATCH = 1000  # runs re-queued at once when a workflow's pause is lifted; the sweeper does the rest


def workflow_pause_of(run: WorkflowRun) -> WorkflowPause | None:
    """The workflow pause that holds ``run``, if any (its version's, else every version's)."""
    pauses = WorkflowPause.objects.filter(workflow_name=run.workflow_name, version__in=[run.version])
    return pauses.first() or WorkflowPause.objects.filter(
        workflow_name=run.workflow_name, version__isnull=True).first()


def run_is_paused(run: WorkflowRun) -> bool:
    return run.status not in TERMINAL_STATUSES and (run.paused_at is not None or workflow_pause_of(run) is not None)


def run_pause_info(run: WorkflowRun) -> dict[str, Any] | None:
    """What holds an unfinished run, for a person: ``{"scope": "run" | "workflow", "since",
    "by", "reason"}`` (and ``"version"`` for a workflow's pause), its own pause first; None if
    nothing does."""
    if run.status in TERMINAL_STATUSES:
        return None
    if run.paused_at is not None:
        entry = JournalEntry.objects.filter(run_id=run.id, kind=JournalKind.OPERATOR_ACTION, name="pause") \
            .order_by("-seq").values_list("payload", flat=True).first()
        payload: dict[str, Any] = entry if isinstance(entry, dict) else {}
        return {"scope": "run", "since": run.paused_at, "by": payload.get("by", ""),
                "reason": payload.get("reason", "")}
    pause = workflow_pause_of(run)
    if pause is None:
        return None
    return {"scope": "workflow", "since": pause.created_at, "by": pause.paused_by_label, "reason": pause.reason,
            "version": pause.version}


def run_pause(*, run_id: Any, user: User | None, reason: str) -> WorkflowRun:
    """Hold the run: it is not claimed until ``run_resume``. A worker that has it finishes the
    step in flight and hands it back at the next boundary. Refused (``ActionNotAllowed``) if
    it is already paused, ``RunFinished`` if it is finished."""
    actor, reason = actor_label(user), required_reason(reason, "pause a run")
    with transaction.atomic():
        run = run_lock(run_id=str(run_id))
        if run.status in TERMINAL_STATUSES:
            raise RunFinished(f"run {run.id} is already {run.status}; there is nothing to pause")
        if run.paused_at is not None:
            raise ActionNotAllowed(f"run {run.id} is already paused (since {run.paused_at:%Y-%m-%d %H:%M:%S} UTC)")
        run.paused_at = timezone.now()
        WorkflowRun.objects.filter(id=run.id).update(paused_at=run.paused_at, updated_at=run.paused_at)
        held_by = run.lease_owner if run.status in LEASED_STATUSES and run.lease_owner else ""
        systemdb.append_event(
            str(run.id), kind=JournalKind.OPERATOR_ACTION, name="pause", worker=actor,
            payload=dumps({"action": "pause", "by": actor, "reason": reason, "status": run.status,
                           **({"worker": held_by} if held_by else {})}),
        )
        send_run_changed(run.id, run.status, cause=JournalKind.OPERATOR_ACTION)
    return run


def run_resume(*, run_id: Any, user: User | None, reason: str) -> WorkflowRun:
    """Lift the run's own pause and let it go on: re-queued if it was runnable, its timer fired
    if it fell due meanwhile. A run also held by its workflow's pause stays held until that
    pause is lifted (the answer says so). ``ActionNotAllowed`` if the run is not paused."""
    actor, reason = actor_label(user), required_reason(reason, "resume a run")
    with transaction.atomic():
        run = run_lock(run_id=str(run_id))
        if run.paused_at is None:
            pause = workflow_pause_of(run)
            if pause is not None:
                raise ActionNotAllowed(
                    f"run {run.id} is held by the pause of {pause.workflow_name} "
                    f"({'version ' + str(pause.version) if pause.version is not None else 'every version'}) "
                    f"by {pause.paused_by_label}; resume the workflow instead")
            raise ActionNotAllowed(f"run {run.id} is not paused")
        since: datetime = run.paused_at
        run.paused_at = None
        WorkflowRun.objects.filter(id=run.id).update(paused_at=None, updated_at=timezone.now())
        systemdb.append_event(
            str(run.id), kind=JournalKind.OPERATOR_ACTION, name="resume", worker=actor,
            payload=dumps({"action": "resume", "by": actor, "reason": reason, "status": run.status,
                           "paused_for_s": round((timezone.now() - since).total_seconds(), 3)}),
        )
        _release(run, actor=actor)
    run.refresh_from_db()
    return run


def _release(run: WorkflowRun, *, actor: str) -> None:
    """Inside the caller's transaction, the run locked and no longer paused by itself: wake what
    the pause held back, unless a workflow pause still holds the run."""
    if workflow_pause_of(run) is not None:
        send_run_changed(run.id, run.status, cause=JournalKind.OPERATOR_ACTION)
        return
    if run.status == RunStatus.WAITING:
        if not run_wake_if_due(run, actor=actor):
            send_run_changed(run.id, run.status, cause=JournalKind.OPERATOR_ACTION)
        return
    runnable = run.status == RunStatus.PENDING or (
        run.status in LEASED_STATUSES and (run.lease_expires_at is None or run.lease_expires_at < timezone.now()))
    if runnable:
        queue.enqueue_after_commit(run.id, run.definition_hash, compensating=run.status == RunStatus.COMPENSATING,
                                   priority=run.priority)
    send_run_changed(run.id, run.status, cause=JournalKind.OPERATOR_ACTION)


def _check_workflow(workflow_name: str, version: int | None) -> None:
    known = WorkflowVersion.objects.filter(name=workflow_name)
    if version is not None:
        known = known.filter(version=version)
    if not known.exists() and not WorkflowRun.objects.filter(
            workflow_name=workflow_name, **({"version": version} if version is not None else {})).exists():
        which = f"{workflow_name!r} version {version}" if version is not None else repr(workflow_name)
        raise InvalidArgument(f"no workflow {which} is registered or has runs")


def workflow_pause(*, workflow_name: str, version: int | None = None, user: User | None,
                   reason: str) -> WorkflowPause:
    """Hold every run of ``workflow_name`` (one ``version``, or every version when None), new
    runs included, until ``workflow_resume``. Runs being advanced stop at their next step
    boundary. ``ActionNotAllowed`` if that same pause is already in place."""
    actor, reason = actor_label(user), required_reason(reason, "pause a workflow")
    checked_text(workflow_name, what="workflow", max_length=200)
    _check_workflow(workflow_name, version)
    try:
        with transaction.atomic():
            pause = WorkflowPause.objects.create(workflow_name=workflow_name, version=version, reason=reason,
                                                 paused_by=user, paused_by_label=actor)
    except IntegrityError:
        which = f"version {version}" if version is not None else "every version"
        raise ActionNotAllowed(f"{workflow_name} ({which}) is already paused") from None
    return pause


def workflow_resume(*, workflow_name: str, version: int | None = None, user: User | None,
                    reason: str) -> int:
    """Lift the pause of ``workflow_name`` (exactly as it was set: one version, or every
    version) and re-queue its runnable runs that nothing else holds; runs whose timer fell due
    meanwhile are woken by the sweeper's next pass. Returns the number of runs re-queued now.
    ``ActionNotAllowed`` if there is no such pause."""
    required_reason(reason, "resume a workflow")
    with transaction.atomic():
        deleted, _ = WorkflowPause.objects.filter(workflow_name=workflow_name, version=version).delete()
        if not deleted:
            which = f"version {version}" if version is not None else "every version"
            raise ActionNotAllowed(f"{workflow_name} ({which}) is not paused")
    runs = WorkflowRun.objects.filter(workflow_name=workflow_name, paused_at__isnull=True,
                                      status__in=[RunStatus.PENDING, RunStatus.COMPENSATING],
                                      lease_expires_at__isnull=True)
    if version is not None:
        runs = runs.filter(version=version)
    released = 0
    rows = runs.values_list("id", "definition_hash", "status", "priority")[:RELEASE_BATCH]
    for run_id, definition_hash, status, priority in rows:
        if queue.enqueue_advance(str(run_id), definition_hash, compensating=status == RunStatus.COMPENSATING,
                                 priority=priority):
            released += 1
    return released

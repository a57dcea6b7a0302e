"""Repair a run: move it to another version of its code, and redrive it from where it failed.

Both keep the run's id and its whole history, and edit nothing in it: each is one journal entry
(``moved``, ``redriven``) written in the transaction that changes the run, under the run's row
lock, after the checks below. The console and the HTTP API audit them (``operators.services``).

**Move** (``run_move``): the run's version and definition hash become the target's, so its next
claim replays on that code. Only if the run replays cleanly on the target code at that moment:
the replay check (``sagas.replay.check``) is run again under the lock, whatever a page showed
before. The target must be registered in this process, and a worker that has it must exist for
the run to go on. A run a worker is advancing right now is refused: pause it first
(``sagas.pausing``), and it is handed back at its next step boundary. A run parked because no
worker had its code (``version_mismatch``) or because its code diverged from its history
(``non_determinism``) goes on at once on the new code: the reason it was parked is gone.

**Redrive** (``run_redrive``): a FAILED run (its effects still in place) or one parked in
NEEDS_ATTENTION for its code (``non_determinism``, ``workflow_error``) continues from its
failing step: a step that failed is asked again (its recorded failure stays in the history but
no longer answers), then the workflow goes on. Optionally onto another version first, checked
as a move is. Its budgets are as they were (a run out of budget is retried, not redriven).
What a redrive does not undo: an effect whose outcome is final in the ledger (FAILED_FINAL)
answers the same under its key; start a new run for that.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from sagas.errors import ActionNotAllowed, RunFinished
from sagas.events import send_run_changed
from sagas.models import (
    LEASED_STATUSES,
    CompensationPlan,
    JournalEntry,
    JournalKind,
    RunStatus,
    WorkflowRun,
    check_transition,
)
from sagas.replay.check import COMPATIBLE, check_run
from sagas.runtime import queue
from sagas.store import systemdb
from sagas.store.locks import run_lock
from sagas.store.systemdb import dumps
from sagas.validation import FREE_TEXT_CHARS, checked_text
from sagas.versions import registry

MOVABLE = frozenset({RunStatus.PENDING, RunStatus.WAITING, RunStatus.NEEDS_ATTENTION, RunStatus.FAILED})
# Parked for its code: a move to code that replays its history cleanly takes the reason away.
CODE_REASONS = frozenset({"version_mismatch", "non_determinism"})
REDRIVABLE_REASONS = frozenset({"non_determinism", "workflow_error", "step_failed"})


def _actor(user: User | None) -> str:
    return user.get_username() if user is not None else "system"


def _reason(reason: str, what: str) -> str:
    checked_text(reason, what="reason", max_length=FREE_TEXT_CHARS)
    if not reason.strip():
        raise ActionNotAllowed(f"a reason is required to {what}")
    return reason.strip()


def movable_versions(run: WorkflowRun) -> list[int]:
    """The versions of ``run``'s workflow registered in this process whose code is not the run's
    (where a move or a redrive could take it; each is still checked when it is asked for)."""
    return sorted(d.version for d in registry.all_definitions()
                  if d.name == run.workflow_name and d.definition_hash != run.definition_hash)


def _not_advanced_now(run: WorkflowRun, what: str) -> None:
    if run.status in LEASED_STATUSES and run.lease_expires_at and run.lease_expires_at > timezone.now():
        raise ActionNotAllowed(
            f"run {run.id} is being advanced by {run.lease_owner} right now; pause it first (it is handed "
            f"back at its next step boundary), then {what} it")


def _target(run: WorkflowRun, version: int) -> registry.WorkflowDefinition:
    definition = registry.find(run.workflow_name, version)
    if definition is None:
        raise ActionNotAllowed(
            f"{run.workflow_name} version {version} is not registered in this process; deploy it (SAGAS_MODULES) "
            f"here and on a worker first")
    return definition


def _checked_move(run: WorkflowRun, definition: registry.WorkflowDefinition) -> dict[str, Any]:
    """Under the run's lock: refuse unless ``run`` replays cleanly on ``definition``; the journal
    entry's payload otherwise."""
    checked = check_run(run, definition)
    if checked.outcome != COMPATIBLE:
        where = f" ({checked.source['file']}:{checked.source['line']})" if checked.source else ""
        raise ActionNotAllowed(
            f"run {run.id} does not replay on {definition.name} version {definition.version}: "
            f"{checked.message}{where}; nothing was changed")
    return {"from_version": run.version, "from_hash": run.definition_hash, "to_version": definition.version,
            "to_hash": definition.definition_hash, "checked_to_seq": checked.position}


def _move_locked(run: WorkflowRun, definition: registry.WorkflowDefinition, *, actor: str, reason: str) -> None:
    moved = _checked_move(run, definition)
    systemdb.append_event(str(run.id), kind=JournalKind.MOVED, name="", worker=actor,
                          payload=dumps({**moved, "by": actor, "reason": reason}))
    run.version, run.definition_hash = definition.version, definition.definition_hash
    WorkflowRun.objects.filter(id=run.id).update(version=run.version, definition_hash=run.definition_hash,
                                                 updated_at=timezone.now())


def run_move(*, run_id: Any, version: int, user: User | None, reason: str) -> WorkflowRun:
    """Move the run to ``version`` of its workflow, if its history replays cleanly on that code
    (checked under the run's lock). See the module's docstring. ``ActionNotAllowed`` with the
    divergence otherwise; ``RunFinished`` for a finished run (a FAILED one may be redriven)."""
    actor, reason = _actor(user), _reason(reason, "move a run")
    with transaction.atomic():
        run = run_lock(run_id=str(run_id))
        if run.status in LEASED_STATUSES:
            _not_advanced_now(run, "move")
            if run.status == RunStatus.COMPENSATING:
                raise ActionNotAllowed(f"run {run.id} is compensating: its workflow code is not run any more")
            if run.paused_at is None:  # its worker stopped: any worker may take it up at any moment
                raise ActionNotAllowed(f"run {run.id} is about to be taken up again; pause it, then move it")
        elif run.status not in MOVABLE:
            raise RunFinished(f"run {run.id} is {run.status}; only a run that has not finished can be moved")
        definition = _target(run, version)
        if run.definition_hash == definition.definition_hash:
            raise ActionNotAllowed(f"run {run.id} already runs {run.workflow_name} version {definition.version}'s code")
        if run.status == RunStatus.FAILED:
            raise ActionNotAllowed(f"run {run.id} FAILED: redrive it onto version {version} (it is moved, then "
                                   f"continued from where it failed)")
        _move_locked(run, definition, actor=actor, reason=reason)
        if run.status == RunStatus.NEEDS_ATTENTION and run.status_reason in CODE_REASONS:
            check_transition(run.status, RunStatus.PENDING)
            WorkflowRun.objects.filter(id=run.id).update(status=RunStatus.PENDING, status_reason="", error=None)
            run.status = RunStatus.PENDING
        if run.status == RunStatus.PENDING and run.paused_at is None:
            queue.enqueue_after_commit(run.id, run.definition_hash)
        send_run_changed(run.id, run.status, cause=JournalKind.MOVED)
    run.refresh_from_db()
    return run


def run_redrive(*, run_id: Any, user: User | None, reason: str, version: int | None = None) -> WorkflowRun:
    """Continue a FAILED run, or one parked for its code, from its failing step, keeping its id
    and history; onto ``version`` first if given (checked as ``run_move`` checks). See the
    module's docstring."""
    actor, reason = _actor(user), _reason(reason, "redrive a run")
    with transaction.atomic():
        run = run_lock(run_id=str(run_id))
        parked = run.status == RunStatus.NEEDS_ATTENTION and run.status_reason in REDRIVABLE_REASONS
        if run.status != RunStatus.FAILED and not parked:
            raise ActionNotAllowed(
                f"run {run.id} is {run.status}{' (' + run.status_reason + ')' if run.status_reason else ''}; only a "
                f"FAILED run, or one parked for its code (non_determinism), can be redriven")
        if CompensationPlan.objects.filter(run=run).exists():
            raise ActionNotAllowed(f"run {run.id} has a compensation plan: its effects are being or were undone")
        was = {"status": run.status, "reason": run.status_reason}
        if version is not None and version != run.version:
            _move_locked(run, _target(run, version), actor=actor, reason=reason)
        elif version is not None and registry.find(run.workflow_name, version) is None:
            _target(run, version)
        failed_step = (run.error or {}).get("step") if run.status_reason == "step_failed" else None
        retry_seqs = []
        if failed_step:
            entry = JournalEntry.objects.filter(run=run, kind=JournalKind.STEP, name=failed_step) \
                .order_by("-seq").first()
            if entry is not None and "error" in (entry.payload or {}):
                retry_seqs.append(entry.seq)
        systemdb.append_event(
            str(run.id), kind=JournalKind.REDRIVEN, name=failed_step or "", worker=actor,
            payload=dumps({"by": actor, "reason": reason, "was": was, "version": run.version,
                           "retry_seqs": retry_seqs}),
        )
        check_transition(run.status, RunStatus.PENDING)
        WorkflowRun.objects.filter(id=run.id).update(
            status=RunStatus.PENDING, status_reason="", error=None, result=None, finished_at=None,
            updated_at=timezone.now())
        if run.paused_at is None:
            queue.enqueue_after_commit(run.id, run.definition_hash)
        send_run_changed(run.id, RunStatus.PENDING, cause=JournalKind.REDRIVEN)
    run.refresh_from_db()
    return run

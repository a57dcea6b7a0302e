"""Operator actions on a run: cancel, retry, compensate, pause and resume; and on a workflow:
pause and resume all its runs (each through ``actions.perform``).

The run is locked (``sagas.store.locks.run_lock``) and compared with the status the operator saw;
a run that moved on is refused with what last moved it.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from operators.selectors.tenancy import tenants_of
from operators.services.actions import Actor, Denied, Target, at_time, audit_denied, perform
from operators.services.dual_rules import dual_controlled
from sagas.integration import (
    compensation_start,
    run_cancel,
    run_fork,
    run_is_paused,
    run_lock,
    run_move,
    run_pause,
    run_redrive,
    run_resume,
    run_retry,
    workflow_pause,
    workflow_resume,
)
from sagas.models import JournalEntry, WorkflowPause, WorkflowRun


def _run_last_change(run: WorkflowRun) -> str:
    """The newest entry of the run's history, in words: what last moved it, by whom, when."""
    entry = JournalEntry.objects.filter(run_id=run.id).order_by("-seq").first()
    if entry is None:
        return ""
    what = entry.kind.replace("_", " ") + (f" “{entry.name}”" if entry.name else "")
    return f"{what} by {entry.worker_id or 'the engine'}{at_time(entry.created_at)}"


def _run_snapshot(run_id: str) -> dict[str, Any]:
    r = WorkflowRun.objects.get(id=run_id)
    return {"state": r.status, "reason": r.status_reason, "fence": r.fence, "paused": run_is_paused(r),
            "version": r.version, "definition_hash": r.definition_hash, "last_change": _run_last_change(r)}


def _run_stale(now: dict[str, Any], seen: str) -> str:
    last = f" ({now['last_change']})" if now.get("last_change") else ""
    return (f"This run is now {now['state']}{last}; it changed since you loaded the page (you saw {seen}), "
            f"so nothing was changed.")


def _run_target(run_id: str) -> Target:
    return Target("run", run_id, lock=lambda: run_lock(run_id=run_id), snapshot=lambda: _run_snapshot(run_id),
                  stale=_run_stale)


@dual_controlled(lambda a: "run.compensate" if a["compensate"] else None,
                 lambda a: f"Cancel and compensate run {a['run_id']}")
def run_cancel_act(actor: Actor, *, run_id: str, reason: str, compensate: bool, expected: str | None) -> Any:
    return perform(
        actor, "run.cancel", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: run_cancel(run_id=run_id, user=actor.user, reason=reason, compensate=compensate),
    )


@dual_controlled(lambda a: "run.compensate", lambda a: f"Compensate run {a['run_id']}")
def run_compensate_act(actor: Actor, *, run_id: str, reason: str, expected: str | None) -> Any:
    return perform(
        actor, "run.compensate", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: compensation_start(run_id=run_id, user=actor.user, reason=reason),
    )


def run_retry_act(actor: Actor, *, run_id: str, reason: str, expected: str | None) -> Any:
    return perform(
        actor, "run.retry", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: run_retry(run_id=run_id, user=actor.user, reason=reason),
    )


@dual_controlled(lambda a: "run.pause", lambda a: f"Pause run {a['run_id']}")
def run_pause_act(actor: Actor, *, run_id: str, reason: str, expected: str | None) -> Any:
    return perform(
        actor, "run.pause", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: run_pause(run_id=run_id, user=actor.user, reason=reason),
    )


def run_resume_act(actor: Actor, *, run_id: str, reason: str, expected: str | None) -> Any:
    return perform(
        actor, "run.resume", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: run_resume(run_id=run_id, user=actor.user, reason=reason),
    )


@dual_controlled(lambda a: "run.move", lambda a: f"Move run {a['run_id']} to version {a['version']}")
def run_move_act(actor: Actor, *, run_id: str, version: int, reason: str, expected: str | None) -> Any:
    return perform(
        actor, "run.move", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: run_move(run_id=run_id, version=version, user=actor.user, reason=reason),
    )


@dual_controlled(lambda a: "run.redrive",
                 lambda a: f"Redrive run {a['run_id']}" + (f" on version {a['version']}" if a["version"] else ""))
def run_redrive_act(actor: Actor, *, run_id: str, version: int | None, reason: str, expected: str | None) -> Any:
    return perform(
        actor, "run.redrive", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: run_redrive(run_id=run_id, version=version, user=actor.user, reason=reason),
    )


@dual_controlled(lambda a: "run.fork", lambda a: (
    f"Re-run run {a['run_id']} from entry {a['at_seq']}" + (f" on version {a['version']}" if a["version"] else "")
    + (", compensating its later effects first" if a.get("compensate_first") else "")))
def run_fork_act(actor: Actor, *, run_id: str, at_seq: int, version: int | None, reason: str,
                 expected: str | None, forks_seen: int | None = None, compensate_first: bool = False) -> Any:
    """Audited on the source run (the new run's id is in its history and the answer)."""
    return perform(
        actor, "run.fork", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: run_fork(run_id=run_id, at_seq=at_seq, version=version, user=actor.user, reason=reason,
                                forks_seen=forks_seen, compensate_first=compensate_first),
    )


# --- a workflow's pause -----------------------------------------------------------------------


def _workflow_id(name: str, version: int | None) -> str:
    return f"{name} v{version}" if version is not None else f"{name} (every version)"


def _workflow_snapshot(name: str, version: int | None) -> dict[str, Any]:
    pause = WorkflowPause.objects.filter(workflow_name=name, version=version).first() if version is not None \
        else WorkflowPause.objects.filter(workflow_name=name, version__isnull=True).first()
    if pause is None:
        return {"state": "running"}
    return {"state": "paused", "by": pause.paused_by_label, "reason": pause.reason,
            "since": pause.created_at.isoformat()}


def _workflow_target(name: str, version: int | None) -> Target:
    def stale(now: dict[str, Any], seen: str) -> str:
        who = f" by {now['by']}" if now.get("by") else ""
        return (f"{_workflow_id(name, version)} is now {now['state']}{who}; it changed since you loaded the page "
                f"(you saw it {seen}), so nothing was changed.")

    def lock() -> None:  # one pause per workflow and version: writers of it queue here
        WorkflowPause.objects.select_for_update().filter(workflow_name=name).exists()

    return Target("workflow", _workflow_id(name, version), lock=lock,
                  snapshot=lambda: _workflow_snapshot(name, version), stale=stale)


def _every_tenant(actor: Actor, action: str, name: str, version: int | None, reason: str) -> None:
    """A workflow's pause holds every tenant's runs: only someone who sees every tenant may set
    or lift it (denied and audited otherwise)."""
    if tenants_of(actor.user) is not None:
        with transaction.atomic():
            audit_denied(actor, action, "workflow", _workflow_id(name, version), reason=reason)
        raise Denied(f"{actor.label} may not {action.replace('.', ' ')}: it holds the runs of every tenant, "
                     f"and {actor.label} sees only some")


def workflow_pause_act(actor: Actor, *, name: str, version: int | None, reason: str, expected: str | None) -> Any:
    _every_tenant(actor, "workflow.pause", name, version, reason)
    return perform(
        actor, "workflow.pause", _workflow_target(name, version), reason=reason, expected=expected,
        change=lambda: workflow_pause(workflow_name=name, version=version, user=actor.user, reason=reason),
    )


def workflow_resume_act(actor: Actor, *, name: str, version: int | None, reason: str, expected: str | None) -> Any:
    _every_tenant(actor, "workflow.resume", name, version, reason)
    return perform(
        actor, "workflow.resume", _workflow_target(name, version), reason=reason, expected=expected,
        change=lambda: workflow_resume(workflow_name=name, version=version, user=actor.user, reason=reason),
    )

"""Operator actions on a run: cancel, retry, compensate (each through ``actions.perform``).

The run is locked (``sagas.store.locks.run_lock``) and compared with the status the operator saw;
a run that moved on is refused with what last moved it.
"""

from __future__ import annotations

from typing import Any

from operators.services.actions import Actor, Target, at_time, perform
from sagas.integration import compensation_start, run_cancel, run_lock, run_retry
from sagas.models import JournalEntry, WorkflowRun


def _run_last_change(run: WorkflowRun) -> str:
    """The newest entry of the run's history, in words: what last moved it, by whom, when."""
    entry = JournalEntry.objects.filter(run_id=run.id).order_by("-seq").first()
    if entry is None:
        return ""
    what = entry.kind.replace("_", " ") + (f" “{entry.name}”" if entry.name else "")
    return f"{what} by {entry.worker_id or 'the engine'}{at_time(entry.created_at)}"


def _run_snapshot(run_id: str) -> dict[str, Any]:
    r = WorkflowRun.objects.get(id=run_id)
    return {"state": r.status, "reason": r.status_reason, "fence": r.fence, "last_change": _run_last_change(r)}


def _run_stale(now: dict[str, Any], seen: str) -> str:
    last = f" ({now['last_change']})" if now.get("last_change") else ""
    return (f"This run is now {now['state']}{last}; it changed since you loaded the page (you saw {seen}), "
            f"so nothing was changed.")


def _run_target(run_id: str) -> Target:
    return Target("run", run_id, lock=lambda: run_lock(run_id=run_id), snapshot=lambda: _run_snapshot(run_id),
                  stale=_run_stale)


def run_cancel_act(actor: Actor, *, run_id: str, reason: str, compensate: bool, expected: str | None) -> Any:
    return perform(
        actor, "run.cancel", _run_target(run_id), reason=reason, expected=expected,
        change=lambda: run_cancel(run_id=run_id, user=actor.user, reason=reason, compensate=compensate),
    )


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

"""How a ledger resolution reaches its run (the receivers of ``ledger.services``' signals).

An effect's resolution (a person's, or the reconciler's lookup) is the ledger's; the run
it belongs to is the engine's. Inside the resolving transaction, the run's row is locked
before the effect's (``sagas.store.locks``' order, the same as every other writer), the
resolution is journaled on the run, and a run parked only because of UNKNOWN effects
resumes once none remains.

The sweeper's re-checks of parked runs live here too (``runs_resume_settled``,
``runs_resume_cleared``): a run is never left parked for a reason that no longer holds.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from ledger.errors import InvalidResolution
from ledger.flow import spend
from ledger.journal import KINDS
from ledger.models import EffectRecord, EffectStatus
from ledger.protocol import result_payload
from sagas.events import send_run_changed
from sagas.models import (
    LEASED_STATUSES,
    OPEN_APPROVAL_STATES,
    ApprovalRequest,
    JournalKind,
    RunStatus,
    WorkflowRun,
    check_transition,
)
from sagas.runtime import queue
from sagas.store import systemdb
from sagas.store.locks import effect_run_lock, run_lock
from sagas.store.systemdb import dumps


def run_lock_for_effect_resolution(*, effect_id: int) -> None:
    """Before an effect's resolution locks the effect: lock its run (``sagas.store.locks``' order).

    Called inside the resolving transaction (``ledger.services.effect_resolving``). Refuses,
    before anything is changed, when a worker is advancing the run right now: its own
    recovery settles the effect.
    """
    run = effect_run_lock(effect_id=effect_id)
    if run is None:
        return
    if run.status in LEASED_STATUSES and run.lease_expires_at and run.lease_expires_at > timezone.now():
        raise InvalidResolution(
            f"run {run.id} is being advanced by {run.lease_owner} right now; its recovery settles this effect"
        )


def run_effect_resolved(*, effect: EffectRecord, outcome: str, actor: str) -> None:
    """Journal an effect's resolution on its run and wake the run if nothing else holds it.

    Called inside the resolving transaction (``ledger.services.effect_resolved``), whose
    ``effect_resolving`` already locked the run and refused if a worker holds it.
    """
    run = WorkflowRun.objects.select_for_update().filter(id=effect.run_id).first()
    if run is None:
        return
    systemdb.append_event(
        str(run.id), kind=JournalKind.EFFECT_RESOLVED, name=effect.step_name, worker=actor,
        payload=dumps({
            "effect_id": effect.id, "key": effect.idempotency_key, "outcome": outcome, "by": actor,
            "resolution": effect.resolution, "note": effect.resolution_note, "downstream_ref": effect.downstream_ref,
        }),
    )
    if outcome in ("succeeded", "failed"):
        systemdb.append_event(
            str(run.id), kind=KINDS[effect.kind].result, name=effect.step_name, worker=actor,
            payload=dumps(result_payload(effect)),
        )
    send_run_changed(run.id, run.status, cause=JournalKind.EFFECT_RESOLVED)
    run_wake_if_unblocked(run_id=str(run.id), reason=f"effect {effect.step_name} resolved ({outcome}) by {actor}")


# A run parked for one of these reasons resumes by itself, in this status, once no
# UNKNOWN ledger record of it remains.
_RESUME_AFTER_RESOLUTION = {
    "effect_unknown": RunStatus.PENDING,
    "compensation_unknown": RunStatus.COMPENSATING,
}


def run_wake_if_unblocked(*, run_id: str, reason: str) -> bool:
    """NEEDS_ATTENTION because of an UNKNOWN effect -> running again once none remains.
    Inside the caller's transaction; locks the run (first, or again)."""
    run = run_lock(run_id=run_id)
    target = _RESUME_AFTER_RESOLUTION.get(run.status_reason)
    if run.status != RunStatus.NEEDS_ATTENTION or target is None:
        return False
    if EffectRecord.objects.filter(run_id=run.id, status=EffectStatus.UNKNOWN).exists():
        return False
    _resume(run, target, reason)
    return True


def _resume(run: WorkflowRun, target: str, reason: str) -> None:
    """A parked run (locked) goes on in ``target``: journaled ``resumed`` with why, woken."""
    check_transition(run.status, target)
    WorkflowRun.objects.filter(id=run.id).update(
        status=target, status_reason="", error=None, updated_at=timezone.now()
    )
    systemdb.append_event(str(run.id), kind=JournalKind.RESUMED, name="", worker="system",
                          payload=dumps({"reason": reason}))
    queue.enqueue_after_commit(run.id, run.definition_hash, compensating=target == RunStatus.COMPENSATING,
                               priority=run.priority)
    send_run_changed(run.id, target, cause=JournalKind.RESUMED)


def runs_resume_settled(*, limit: int = 1000) -> list[str]:
    """The sweeper's re-check of runs parked for UNKNOWN effects: each whose unknown effects have
    all been settled since (an answer that reached a worker after it lost the run, a resolution
    whose wake-up was lost) resumes, as ``run_wake_if_unblocked`` would have resumed it. A run
    is never left parked for a reason that no longer holds. The ids of the runs resumed."""
    parked = list(
        WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION, status_reason__in=list(_RESUME_AFTER_RESOLUTION))
        .exclude(id__in=EffectRecord.objects.filter(status=EffectStatus.UNKNOWN).values("run_id"))
        .order_by("updated_at").values_list("id", flat=True)[:limit]
    )
    resumed = []
    why = "its unknown effects were settled (found by the sweeper)"
    for run_id in parked:
        with transaction.atomic():
            if run_wake_if_unblocked(run_id=str(run_id), reason=why):
                resumed.append(str(run_id))
    return resumed


def _budget_left(run: WorkflowRun) -> bool:
    """Whether the budget the run was parked for (``error["budget"]``) has room again."""
    budget = (run.error or {}).get("budget")
    if budget == "steps":
        return run.max_steps is None or run.steps_used < run.max_steps
    if budget == "cost":
        return run.max_cost is None or run.cost_used < run.max_cost
    if budget == "duration":
        started = run.started_at or run.created_at
        return run.max_duration is None or timezone.now() - started < run.max_duration
    return False


def _still_parked(run: WorkflowRun) -> str:
    """Why a run parked for an approval or a budget may go on now ("" while the reason holds)."""
    if run.status_reason == "approval_escalated":
        if not ApprovalRequest.objects.filter(run=run, state__in=OPEN_APPROVAL_STATES).exists():
            return "its escalated approval was decided or closed (found by the sweeper)"
    elif run.status_reason == "budget_exceeded" and _budget_left(run):
        return "its budget has room again (found by the sweeper)"
    elif run.status_reason == "spend_limit" and spend.over(
            tenant=run.tenant, connector=str((run.error or {}).get("connector") or "")) is None:
        return "its tenant is under the day's spend limit again (found by the sweeper)"
    return ""


def _spend_cleared(*, limit: int) -> list[Any]:
    """Runs parked at a spend limit (``ledger.flow.spend``) whose tenant is under it again: the
    limit was raised, or the UTC day turned. One spend read per (tenant, connector) parked."""
    parked = WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION, status_reason="spend_limit").order_by(
        "updated_at").values_list("id", "tenant", "error__connector")[:limit]
    still: dict[tuple[str, str], bool] = {}
    cleared = []
    for run_id, tenant, connector in parked:
        if (tenant, connector) not in still:
            still[(tenant, connector)] = spend.over(tenant=tenant, connector=str(connector or "")) is not None
        if not still[(tenant, connector)]:
            cleared.append(run_id)
    return cleared


def runs_resume_cleared(*, limit: int = 1000) -> list[str]:
    """The sweeper's re-check of runs parked for an approval, a budget or a spend limit: one whose
    escalated approval is no longer open (decided, or closed, while the wake-up was lost), whose
    exhausted budget has room again (its limit raised) or whose tenant is under its day's spend
    limit again resumes. The ids of the runs resumed.
    (UNKNOWN effects: ``runs_resume_settled``; version mismatches:
    ``sagas.services.runs_resume_stranded``.)"""
    # Only runs whose reason looks gone are locked and looked at again: the many that are rightly
    # parked cost one indexed read per pass, not a transaction each.
    open_approval = ApprovalRequest.objects.filter(run=OuterRef("pk"), state__in=OPEN_APPROVAL_STATES)
    room = (
        (Q(error__budget="steps") & (Q(max_steps__isnull=True) | Q(steps_used__lt=F("max_steps"))))
        | (Q(error__budget="cost") & (Q(max_cost__isnull=True) | Q(cost_used__lt=F("max_cost"))))
        | (Q(error__budget="duration") & (Q(max_duration__isnull=True)
                                          | Q(started_at__gt=Now() - F("max_duration"))))
    )
    parked = list(WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION).filter(
        (Q(status_reason="approval_escalated") & ~Exists(open_approval)) | (Q(status_reason="budget_exceeded") & room)
    ).order_by("updated_at").values_list("id", flat=True)[:limit])
    parked += _spend_cleared(limit=limit)
    resumed = []
    for run_id in parked:
        with transaction.atomic():
            run = run_lock(run_id=str(run_id))
            if run.status != RunStatus.NEEDS_ATTENTION:
                continue
            why = _still_parked(run)
            if why:
                _resume(run, RunStatus.PENDING, why)
                resumed.append(str(run_id))
    return resumed

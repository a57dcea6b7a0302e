"""How a ledger resolution reaches its run (the receivers of ``ledger.services``' signals).

An effect's resolution (a person's, or the reconciler's lookup) is the ledger's; the run
it belongs to is the engine's. Inside the resolving transaction, the run's row is locked
before the effect's (``sagas.store.locks``' order, the same as every other writer), the
resolution is journaled on the run, and a run parked only because of UNKNOWN effects
resumes once none remains.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from ledger.errors import InvalidResolution
from ledger.journal import KINDS
from ledger.models import EffectRecord, EffectStatus
from ledger.protocol import result_payload
from sagas.events import send_run_changed
from sagas.models import LEASED_STATUSES, JournalKind, RunStatus, WorkflowRun, check_transition
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
    check_transition(run.status, target)
    WorkflowRun.objects.filter(id=run.id).update(
        status=target, status_reason="", error=None, updated_at=timezone.now()
    )
    systemdb.append_event(str(run.id), kind=JournalKind.RESUMED, name="", worker="system",
                          payload=dumps({"reason": reason}))
    queue.enqueue_after_commit(run.id, run.definition_hash, compensating=target == RunStatus.COMPENSATING)
    send_run_changed(run.id, target, cause=JournalKind.RESUMED)
    return True


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

"""The one lock order for writes made outside a worker's claim.

Operators (approve, reject, cancel, compensate, retry, resolve), the reconciler and the
sweeper all lock, inside their transaction and in this order:

    1. the run's row (``SELECT ... FOR UPDATE`` on ``sagas_workflowrun``),
    2. its approvals,
    3. its ledger effects,
    4. its compensation plan, then the plan's items.

Two writers on one run therefore queue on the run's row and never hold each other's
second lock: no deadlock, and whoever comes second reads the first one's committed
result (READ COMMITTED: every statement after the lock sees the latest commit), so the
state an operator saw can be checked under the lock. Worker paths that touch approvals
or plan items take the run's row first as well (``Context._check_fence`` or their fenced
journal append).

A ledger row is the one exception to waiting: a worker settling an effect whose lease has
run out may hold the effect's row and then wait for the run's. Rather than deadlock with
it, ``effect_lock`` does not wait for an effect's row (``NOWAIT``,
``ledger.services.effect_row_lock``) and refuses with ``InvalidResolution``: the worker is
recording the outcome right now.

Each helper is meant to be called inside ``transaction.atomic()``; locks last until the
outermost transaction ends, and taking one twice in a transaction is free.
"""

from __future__ import annotations

from typing import Any

from ledger.models import EffectRecord
from ledger.services import effect_row_lock
from sagas.models import ApprovalRequest, WorkflowRun


def run_lock(*, run_id: Any) -> WorkflowRun:
    """Lock the run's row and return it as it is now. ``WorkflowRun.DoesNotExist`` if unknown."""
    return WorkflowRun.objects.select_for_update().get(id=run_id)


def approval_lock(*, approval_id: int) -> tuple[WorkflowRun, ApprovalRequest]:
    """Lock the approval's run, then the approval. ``ApprovalRequest.DoesNotExist`` if unknown."""
    run_id = ApprovalRequest.objects.values_list("run_id", flat=True).get(id=approval_id)  # never changes
    run = run_lock(run_id=run_id)
    return run, ApprovalRequest.objects.select_for_update().get(id=approval_id)


def effect_run_lock(*, effect_id: int) -> WorkflowRun | None:
    """Lock the run that recorded the effect (step 1 of the order), or None if it has no run
    here. ``EffectRecord.DoesNotExist`` if the effect is unknown."""
    run_id = EffectRecord.objects.values_list("run_id", flat=True).get(id=effect_id)  # never changes
    return WorkflowRun.objects.select_for_update().filter(id=run_id).first()


def effect_lock(*, effect_id: int) -> tuple[WorkflowRun | None, EffectRecord]:
    """Lock the effect's run, then the effect."""
    run = effect_run_lock(effect_id=effect_id)
    return run, effect_row_lock(effect_id=effect_id)


__all__ = ["approval_lock", "effect_lock", "effect_row_lock", "effect_run_lock", "run_lock"]

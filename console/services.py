"""Operator actions: role check, stale-state check, the domain service, and the audit entry,
all in one transaction. A denied or refused attempt is audited too (in its own transaction,
since nothing else is written)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from console import roles
from console.models import AuditEntry, AuditOutcome
from ledger.errors import LedgerError
from ledger.models import EffectRecord, EffectStatus
from ledger.reconcile import reconcile_effect
from ledger.services import effect_resolve
from sagas.compensation import compensation_start
from sagas.errors import ActionNotAllowed, SagaError
from sagas.models import ApprovalRequest, RunStatus, WorkflowRun
from sagas.services import run_cancel, run_retry
from sagas.waits import approval_decide


class Denied(Exception):
    """The user's role does not allow the action (HTTP 403)."""


class Refused(Exception):
    """The action is not possible in the object's current state (HTTP 409): a stale page,
    a double submit, someone faster. The message says what happened."""


@dataclass(frozen=True)
class Actor:
    user: AbstractBaseUser
    ip: str | None

    @property
    def label(self) -> str:
        return self.user.get_username()


def _audit(actor: Actor, action: str, object_type: str, object_id: Any, *, outcome: str, reason: str = "",
           before: Any = None, after: Any = None, message: str = "") -> AuditEntry:
    return AuditEntry.objects.create(
        actor=actor.user, actor_label=actor.label, action=action, object_type=object_type,
        object_id=str(object_id), before=before, after=after, reason=reason, ip=actor.ip, outcome=outcome,
        message=message[:4000],
    )


def perform(
    actor: Actor, action: str, object_type: str, object_id: Any, *, reason: str,
    snapshot: Callable[[], Any], change: Callable[[], Any], expected: str | None = None,
) -> Any:
    """Run ``change`` as ``actor`` if their role allows ``action``; audit in the same transaction.

    ``expected`` is the state the user saw on the page (from the form); if the object has
    moved on since, the action is refused instead of applied to something else.
    """
    if not roles.can(actor.user, action):
        _audit(actor, action, object_type, object_id, outcome=AuditOutcome.DENIED, reason=reason,
               message=f"role {roles.ACTION_ROLES[action]} required")
        raise Denied(f"{actor.label} may not {action.replace('.', ' ')}: it needs the {roles.ACTION_ROLES[action]} role")
    try:
        with transaction.atomic():
            before = snapshot()
            if expected is not None and before.get("state") != expected:
                raise Refused(f"it changed since you loaded the page: it is now {before.get('state')}, not {expected}")
            result = change()
            _audit(actor, action, object_type, object_id, outcome=AuditOutcome.OK, reason=reason,
                   before=before, after=snapshot())
            return result
    except (Refused, SagaError, LedgerError) as exc:
        message = str(exc)
        _audit(actor, action, object_type, object_id, outcome=AuditOutcome.REFUSED, reason=reason, message=message)
        raise Refused(message) from exc


# --- snapshots (what the audit log shows as before/after) ---------------------------


def _effect_snapshot(effect_id: int) -> dict:
    e = EffectRecord.objects.get(id=effect_id)
    return {"state": e.status, "downstream_ref": e.downstream_ref, "resolution": e.resolution,
            "resolved_by": e.resolved_by_label, "attempts": e.attempts}


def _run_snapshot(run_id: str) -> dict:
    r = WorkflowRun.objects.get(id=run_id)
    return {"state": r.status, "reason": r.status_reason, "fence": r.fence}


def _approval_snapshot(approval_id: int) -> dict:
    a = ApprovalRequest.objects.get(id=approval_id)
    return {"state": a.state, "decided_by": a.decided_by_label, "comment": a.comment}


# --- actions -------------------------------------------------------------------------


def effect_query(actor: Actor, *, effect_id: int) -> str:
    """Run the connector's lookup now; resolves the effect if the answer is conclusive."""
    def change() -> str:
        effect = EffectRecord.objects.select_for_update().get(id=effect_id)
        if effect.status not in (EffectStatus.UNKNOWN, EffectStatus.IN_PROGRESS):
            raise Refused(f"already {effect.status} ({effect.resolution or 'engine'} "
                          f"{effect.resolved_by_label or ''})".rstrip())
        outcome = reconcile_effect(effect, actor=actor.label)
        return type(outcome).__name__

    return perform(actor, "effect.query", "effect", effect_id, reason="query provider",
                   snapshot=lambda: _effect_snapshot(effect_id), change=change)


def effect_manual_resolve(actor: Actor, *, effect_id: int, outcome: str, downstream_ref: str, note: str,
                          expected: str | None) -> EffectRecord:
    return perform(
        actor, "effect.resolve", "effect", effect_id, reason=note, expected=expected,
        snapshot=lambda: _effect_snapshot(effect_id),
        change=lambda: effect_resolve(effect_id=effect_id, outcome=outcome, note=note, user=actor.user,
                                      downstream_ref=downstream_ref),
    )


def approval_act(actor: Actor, *, approval_id: int, approve: bool, comment: str, expected: str | None) -> Any:
    return perform(
        actor, "approval.approve" if approve else "approval.reject", "approval", approval_id, reason=comment,
        expected=expected, snapshot=lambda: _approval_snapshot(approval_id),
        change=lambda: approval_decide(approval_id=approval_id, user=actor.user, approve=approve, comment=comment),
    )


def run_cancel_act(actor: Actor, *, run_id: str, reason: str, compensate: bool, expected: str | None) -> Any:
    return perform(
        actor, "run.cancel", "run", run_id, reason=reason, expected=expected,
        snapshot=lambda: _run_snapshot(run_id),
        change=lambda: run_cancel(run_id=run_id, user=actor.user, reason=reason, compensate=compensate),
    )


def run_compensate_act(actor: Actor, *, run_id: str, reason: str, expected: str | None) -> Any:
    return perform(
        actor, "run.compensate", "run", run_id, reason=reason, expected=expected,
        snapshot=lambda: _run_snapshot(run_id),
        change=lambda: compensation_start(run_id=run_id, user=actor.user, reason=reason),
    )


def run_retry_act(actor: Actor, *, run_id: str, reason: str, expected: str | None) -> Any:
    return perform(
        actor, "run.retry", "run", run_id, reason=reason, expected=expected,
        snapshot=lambda: _run_snapshot(run_id),
        change=lambda: run_retry(run_id=run_id, user=actor.user, reason=reason),
    )


__all__ = ["Actor", "Denied", "Refused", "RunStatus", "ActionNotAllowed"]

"""Operator actions: role check, locks, stale-state check, the domain service and the audit
entry, all in one transaction. A denied or refused attempt is audited too (in its own
transaction, since nothing else is written).

Two people acting on one run at once queue on the run's row: every action takes the locks
of ``sagas.locks`` in its order (the run, then its approvals, effects and plan) before it
reads anything, then compares the state it finds with the one the person saw (the form's
``expected``). So exactly one of them wins; the other is refused (HTTP 409) with what the
state is now, and both are audited with the state each really found under the lock.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
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
from sagas.locks import approval_lock, effect_lock, run_lock
from sagas.models import OPEN_APPROVAL_STATES, ApprovalRequest, JournalEntry, RunStatus, WorkflowRun
from sagas.services import run_cancel, run_retry
from sagas.waits import approval_decide


class Denied(Exception):
    """The user's role does not allow the action (HTTP 403)."""


class Refused(Exception):
    """The action is not possible in the object's current state (HTTP 409): a stale page,
    a double submit, someone faster. The message says what happened.

    ``states_now``: the message already says what the state is now (nothing to add)."""

    def __init__(self, message: str, *, states_now: bool = False) -> None:
        super().__init__(message)
        self.states_now = states_now


class Incomplete(Exception):
    """The form left out something the action needs, such as the state the person saw
    (HTTP 400). Nothing was attempted."""


@dataclass(frozen=True)
class Actor:
    user: AbstractBaseUser
    ip: str | None

    @property
    def label(self) -> str:
        return self.user.get_username()


@dataclass(frozen=True)
class Target:
    """What an action is about, and how to lock, describe and compare it."""

    object_type: str
    object_id: Any
    lock: Callable[[], Any]  # takes the locks in sagas.locks' order, inside the action's transaction
    snapshot: Callable[[], dict[str, Any]]  # what the audit log shows as before/after; has "state"
    stale: Callable[[dict[str, Any], str], str]  # the refusal when the state is not the one seen
    same: Callable[[str, str], bool] = operator.eq  # (seen, now) -> is it the state the person saw?


MISSING_EXPECTED = ("The form did not say which state you saw, so it cannot be checked that nothing changed "
                    "since; reload the page and try again. Nothing was changed.")


def _audit(actor: Actor, action: str, object_type: str, object_id: Any, *, outcome: str, reason: str = "",
           before: Any = None, after: Any = None, message: str = "") -> AuditEntry:
    return AuditEntry.objects.create(
        actor=actor.user, actor_label=actor.label, action=action, object_type=object_type,
        object_id=str(object_id), before=before, after=after, reason=reason, ip=actor.ip, outcome=outcome,
        message=message[:4000],
    )


def perform(
    actor: Actor, action: str, target: Target, *, reason: str, change: Callable[[], Any], expected: str | None,
    require_expected: bool = True,
) -> Any:
    """Run ``change`` as ``actor`` if their role allows ``action``; audit in the same transaction.

    Order: the role (``Denied``, audited, before anything is read); then, in one transaction,
    ``target.lock()``, the snapshot read under those locks, the check that it is still in the
    state ``expected`` the person saw (``Incomplete`` when the form did not say, ``Refused``
    when it moved on), ``change()`` and the audit entry. A refusal rolls everything back and
    is audited with the snapshot read under the lock, never the page's stale view.
    """
    if not roles.can(actor.user, action):
        _audit(actor, action, target.object_type, target.object_id, outcome=AuditOutcome.DENIED, reason=reason,
               message=f"role {roles.ACTION_ROLES[action]} required")
        raise Denied(f"{actor.label} may not {action.replace('.', ' ')}: it needs the {roles.ACTION_ROLES[action]} role")
    seen: dict[str, Any] | None = None
    try:
        with transaction.atomic():
            target.lock()
            before = seen = target.snapshot()
            if not expected:
                if require_expected:
                    raise Incomplete(MISSING_EXPECTED)
            elif not target.same(expected, before["state"]):
                raise Refused(target.stale(before, expected), states_now=True)
            result = change()
            _audit(actor, action, target.object_type, target.object_id, outcome=AuditOutcome.OK, reason=reason,
                   before=before, after=target.snapshot())
            return result
    except (Incomplete, Refused) as exc:
        _audit(actor, action, target.object_type, target.object_id, outcome=AuditOutcome.REFUSED, reason=reason,
               before=seen, message=str(exc))
        raise
    except (SagaError, LedgerError) as exc:
        message = str(exc)
        _audit(actor, action, target.object_type, target.object_id, outcome=AuditOutcome.REFUSED, reason=reason,
               before=seen, message=message)
        raise Refused(message) from exc


# --- targets: locks, snapshots and what to say when the page was stale -------------------------


def _at(when: datetime | None) -> str:
    return f" at {when:%Y-%m-%d %H:%M:%S} UTC" if when else ""


def _run_last_change(run: WorkflowRun) -> str:
    """The newest entry of the run's history, in words: what last moved it, by whom, when."""
    entry = JournalEntry.objects.filter(run_id=run.id, seq=run.last_seq).first()
    if entry is None:
        return ""
    what = entry.kind.replace("_", " ") + (f" “{entry.name}”" if entry.name else "")
    return f"{what} by {entry.worker_id or 'the engine'}{_at(entry.created_at)}"


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


def _approval_snapshot(approval_id: int) -> dict[str, Any]:
    a = ApprovalRequest.objects.select_related("run").get(id=approval_id)
    return {"state": a.state, "decided_by": a.decided_by_label,
            "decided_at": a.decided_at.isoformat() if a.decided_at else None, "comment": a.comment,
            "run_state": a.run.status}


def _approval_stale(now: dict[str, Any], seen: str) -> str:
    if now["state"] in OPEN_APPROVAL_STATES:
        detail = "not decided yet"
    else:
        detail = f"already {now['state'].lower()} by {now['decided_by'] or 'its deadline'}"
        if now.get("decided_at"):
            detail += _at(datetime.fromisoformat(now["decided_at"]))
    return (f"This approval is now {now['state']} ({detail}; its run is {now['run_state']}); you saw it {seen}, "
            f"so nothing was changed.")


def _both_open(seen: str, now: str) -> bool:
    """PENDING and ESCALATED are both undecided: a deadline passing while the approver reads
    does not change what approving means (DESIGN §7: an escalated approval is still decided)."""
    return seen == now or (seen in OPEN_APPROVAL_STATES and now in OPEN_APPROVAL_STATES)


def _approval_target(approval_id: int) -> Target:
    return Target("approval", approval_id, lock=lambda: approval_lock(approval_id=approval_id),
                  snapshot=lambda: _approval_snapshot(approval_id), stale=_approval_stale, same=_both_open)


def _effect_snapshot(effect_id: int) -> dict[str, Any]:
    e = EffectRecord.objects.get(id=effect_id)
    return {"state": e.status, "downstream_ref": e.downstream_ref, "resolution": e.resolution,
            "resolved_by": e.resolved_by_label, "resolved_at": e.resolved_at.isoformat() if e.resolved_at else None,
            "attempts": e.attempts}


def _effect_stale(now: dict[str, Any], seen: str) -> str:
    if now.get("resolved_at"):
        detail = (f"already resolved by {now['resolved_by']}{_at(datetime.fromisoformat(now['resolved_at']))}, "
                  f"{now['resolution']}")
    else:
        detail = f"recorded by the engine, attempt {now['attempts']}"
    return f"This effect is now {now['state']} ({detail}); you saw it {seen}, so nothing was changed."


def _effect_target(effect_id: int, *, lock: bool = True) -> Target:
    return Target("effect", effect_id, lock=(lambda: effect_lock(effect_id=effect_id)) if lock else (lambda: None),
                  snapshot=lambda: _effect_snapshot(effect_id), stale=_effect_stale)


# --- actions -------------------------------------------------------------------------


def effect_query(actor: Actor, *, effect_id: int) -> str:
    """Run the connector's lookup now; resolves the effect if the answer is conclusive.

    Holds no lock while the provider answers (a lookup can take seconds): the resolution it
    may lead to takes its locks in order and re-checks the effect under them."""
    def change() -> str:
        effect = EffectRecord.objects.get(id=effect_id)
        if effect.status not in (EffectStatus.UNKNOWN, EffectStatus.IN_PROGRESS):
            raise Refused(f"already {effect.status} ({effect.resolution or 'engine'} "
                          f"{effect.resolved_by_label or ''})".rstrip())
        outcome = reconcile_effect(effect, actor=actor.label)
        return type(outcome).__name__

    return perform(actor, "effect.query", _effect_target(effect_id, lock=False), reason="query provider",
                   change=change, expected=None, require_expected=False)


def effect_manual_resolve(actor: Actor, *, effect_id: int, outcome: str, downstream_ref: str, note: str,
                          expected: str | None) -> EffectRecord:
    """``expected``: the effect's status the operator saw (required)."""
    return perform(
        actor, "effect.resolve", _effect_target(effect_id), reason=note, expected=expected,
        change=lambda: effect_resolve(effect_id=effect_id, outcome=outcome, note=note, user=actor.user,
                                      downstream_ref=downstream_ref),
    )


def approval_act(actor: Actor, *, approval_id: int, approve: bool, comment: str, expected: str | None) -> Any:
    """``expected``: the approval's state the approver saw (required)."""
    return perform(
        actor, "approval.approve" if approve else "approval.reject", _approval_target(approval_id), reason=comment,
        expected=expected,
        change=lambda: approval_decide(approval_id=approval_id, user=actor.user, approve=approve, comment=comment),
    )


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


__all__ = ["Actor", "Denied", "Incomplete", "Refused", "RunStatus", "ActionNotAllowed"]

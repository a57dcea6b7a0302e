"""Operator actions from the queues: ask a provider about an effect, resolve an effect by hand,
decide an approval (each through ``actions.perform``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ledger.models import EffectRecord, EffectStatus
from ledger.reconcile import reconcile_effect
from ledger.services import effect_resolve
from operators.services.actions import Actor, Incomplete, Refused, Target, at_time, perform
from operators.services.dual_rules import dual_controlled
from sagas.integration import approval_decide, approval_lock, effect_lock
from sagas.models import OPEN_APPROVAL_STATES, ApprovalRequest

# Resolutions that let the effect be done again (or its run be compensated as if it never ran):
# under the dual-control rule effect.resolve_unsafe.
UNSAFE_OUTCOMES = ("not_executed", "failed")

# --- targets: locks, snapshots and what to say when the page was stale -------------------------


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
            detail += at_time(datetime.fromisoformat(now["decided_at"]))
    return (f"This approval is now {now['state']} ({detail}; its run is {now['run_state']}); you saw it {seen}, "
            f"so nothing was changed.")


def _both_open(seen: str, now: str) -> bool:
    """PENDING and ESCALATED are both undecided: a deadline passing while the approver reads
    does not change what approving means (an escalated approval can still be decided)."""
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
        detail = (f"already resolved by {now['resolved_by']}{at_time(datetime.fromisoformat(now['resolved_at']))}, "
                  f"{now['resolution']}")
    else:
        detail = f"recorded by the engine, attempt {now['attempts']}"
    return f"This effect is now {now['state']} ({detail}); you saw it {seen}, so nothing was changed."


def _effect_target(effect_id: int, *, lock: bool = True) -> Target:
    def locker() -> Any:
        return effect_lock(effect_id=effect_id) if lock else None

    return Target("effect", effect_id, lock=locker,
                  snapshot=lambda: _effect_snapshot(effect_id), stale=_effect_stale)


# --- actions -------------------------------------------------------------------------------


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


@dual_controlled(lambda a: "effect.resolve_unsafe" if a["outcome"] in UNSAFE_OUTCOMES else None,
                 lambda a: f"Resolve effect {a['effect_id']} as {a['outcome'].replace('_', ' ')}"
                           + (f" (provider reference {a['downstream_ref']})" if a["downstream_ref"] else ""))
def effect_manual_resolve(actor: Actor, *, effect_id: int, outcome: str, downstream_ref: str, note: str,
                          expected: str | None) -> EffectRecord:
    """``expected``: the effect's status the operator saw (required)."""
    return perform(
        actor, "effect.resolve", _effect_target(effect_id), reason=note, expected=expected,
        change=lambda: effect_resolve(effect_id=effect_id, outcome=outcome, note=note, user=actor.user,
                                      downstream_ref=downstream_ref),
    )


REJECT_NEEDS_A_REASON = ("A reason is required to reject: the run stops and is compensated, and the reason goes "
                         "into the audit log and its history. Nothing was changed.")


def approval_act(actor: Actor, *, approval_id: int, approve: bool, comment: str, expected: str | None) -> Any:
    """``expected``: the approval's state the approver saw (required). A rejection fails the run,
    which compensates what it did: it needs a reason (``comment``; ``Incomplete`` without one,
    audited as refused)."""

    def change() -> Any:
        if not approve and not comment.strip():
            raise Incomplete(REJECT_NEEDS_A_REASON)
        return approval_decide(approval_id=approval_id, user=actor.user, approve=approve, comment=comment)

    return perform(actor, "approval.approve" if approve else "approval.reject", _approval_target(approval_id),
                   reason=comment, expected=expected, change=change)

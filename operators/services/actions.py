"""The frame of every operator action (the actions themselves are in ``runs`` and ``queues``):
role check, locks, stale-state check, the domain service and the audit entry, all in one
transaction. A denied or refused attempt is audited too (in its own
transaction, since nothing else is written).

Two people acting on one run at once queue on the run's row: every action takes the locks
of ``sagas.store.locks`` in its order (the run, then its approvals, effects and plan) before it
reads anything, then compares the state it finds with the one the person saw (the form's
``expected``). So exactly one of them wins; the other is refused (HTTP 409) with what the
state is now, and both are audited with the state each really found under the lock.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from ledger.errors import LedgerError
from operators import roles
from operators.actors import system_label
from operators.models import AuditEntry, AuditOutcome, DualControlRequest, DualState
from operators.selectors.tenancy import object_tenant
from operators.services.dual_rules import (
    Asked,
    ConfirmationNeeded,
    asked_under_rule,
    changed,
    deadline_after,
    seen_at_request,
)
from operators.services.limits import clip_text
from operators.services.tenancy import check_tenant
from sagas.errors import SagaError


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
    """Who acts: a person, or an automated actor acting with a user's roles (``system``: its name,
    such as "approver-bot"; the audit log names it ``system: approver-bot``, ``operators.actors``)."""

    user: User
    ip: str | None
    system: str = ""

    @property
    def label(self) -> str:
        return system_label(self.system) if self.system else self.user.get_username()


@dataclass(frozen=True)
class Target:
    """What an action is about, and how to lock, describe and compare it."""

    object_type: str
    object_id: Any
    lock: Callable[[], Any]  # takes the locks in sagas.store.locks' order, inside the action's transaction
    snapshot: Callable[[], dict[str, Any]]  # what the audit log shows as before/after; has "state"
    stale: Callable[[dict[str, Any], str], str]  # the refusal when the state is not the one seen
    same: Callable[[str, str], bool] = operator.eq  # (seen, now) -> is it the state the person saw?
    # The object's tenant when the target carries it (a tenant's spend limit; the caller has
    # checked the actor may act for it): the audit entries' tenant, with no lookup. None: looked
    # up and checked by ``check_tenant`` (a run, an effect, an approval; "" for the others).
    tenant: str | None = None


_acting: ContextVar[bool] = ContextVar("console_action", default=False)


def in_action() -> bool:
    """Whether a console action (``perform``) is running: what it changes, it audits itself."""
    return _acting.get()


MISSING_EXPECTED = ("The form did not say which state you saw, so it cannot be checked that nothing changed "
                    "since; reload the page and try again. Nothing was changed.")


def _audit(actor: Actor, action: str, object_type: str, object_id: Any, *, outcome: str, reason: str = "",
           before: Any = None, after: Any = None, message: str = "", tenant: str | None = None) -> AuditEntry:
    """``tenant``: the object's, when the caller has read it already (else it is read here)."""
    if tenant is None:
        tenant = object_tenant(object_type, object_id) or ""
    return AuditEntry.objects.create(
        actor=actor.user, actor_label=actor.label, action=action, object_type=object_type,
        object_id=str(object_id), before=before, after=after, reason=clip_text(reason), ip=actor.ip,
        outcome=outcome, message=clip_text(message), tenant=tenant,
    )


def audit_entry(actor: Actor, action: str, object_type: str, object_id: Any, *, outcome: str, reason: str = "",
                before: Any = None, after: Any = None, message: str = "", tenant: str | None = None) -> AuditEntry:
    """An audit entry with any ``outcome`` (dual control's requests and decisions); call it inside
    the transaction of what it records."""
    return _audit(actor, action, object_type, object_id, outcome=outcome, reason=reason, before=before, after=after,
                  message=message, tenant=tenant)


def audit_done(actor: Actor, action: str, object_type: str, object_id: Any, *, reason: str = "", before: Any = None,
               after: Any = None, tenant: str | None = None) -> AuditEntry:
    """Record an action that went through outside ``perform`` (the API's start and signal,
    which create rather than change a locked object). Call it inside the action's transaction."""
    return _audit(actor, action, object_type, object_id, outcome=AuditOutcome.OK, reason=reason, before=before,
                  after=after, tenant=tenant)


def audit_denied(actor: Actor, action: str, object_type: str, object_id: Any, *, reason: str = "",
                 tenant: str | None = None) -> None:
    """Record that ``actor``'s role does not allow ``action`` (whatever ``reason`` holds: it is
    stored clipped, ``clip_text``). In its own transaction: nothing else is written. ``tenant``:
    the object's, when the caller knows it (else it is looked up)."""
    _audit(actor, action, object_type, object_id, outcome=AuditOutcome.DENIED, reason=reason,
           message=f"role {roles.ACTION_ROLES[action]} required", tenant=tenant)


def perform(
    actor: Actor, action: str, target: Target, *, reason: str, change: Callable[[], Any], expected: str | None,
    require_expected: bool = True,
) -> Any:
    """Run ``change`` as ``actor`` if their role allows ``action``; audit in the same transaction.

    Order: the tenant (``NotFound`` for an object outside the actor's tenants, audited, see
    operators/services/tenancy.py; a target that carries its ``tenant`` was checked by the
    caller); the role (``Denied``, audited whatever ``reason`` holds, which ``clip_text`` makes
    storable, before anything is read);
    then, in one transaction, ``target.lock()``, the snapshot read under those locks, the
    check that it is still in the state ``expected`` the person saw (``Incomplete`` when the
    form did not say, ``Refused`` when it moved on), ``change()`` and the audit entry. A refusal
    rolls everything back and is audited with the snapshot read under the lock, never the
    page's stale view.
    """
    if target.tenant is None:
        tenant = check_tenant(actor, action, target.object_type, target.object_id, reason=reason) or ""
    else:
        tenant = target.tenant
    if not roles.can(actor.user, action):
        audit_denied(actor, action, target.object_type, target.object_id, reason=reason, tenant=target.tenant)
        raise Denied(
            f"{actor.label} may not {action.replace('.', ' ')}: it needs the {roles.ACTION_ROLES[action]} role"
        )
    seen: dict[str, Any] | None = None
    acting = _acting.set(True)
    asked = asked_under_rule(tenant)
    try:
        with transaction.atomic():
            target.lock()
            before = seen = target.snapshot()
            if not expected:
                if require_expected:
                    raise Incomplete(MISSING_EXPECTED)
            elif not target.same(expected, before["state"]):
                raise Refused(target.stale(before, expected), states_now=True)
            moved = _moved_since_request(target.object_type, before)
            if moved:
                raise Refused(moved, states_now=True)
            if asked is None:
                result = change()
                _audit(actor, action, target.object_type, target.object_id, outcome=AuditOutcome.OK, reason=reason,
                       before=before, after=target.snapshot(), tenant=tenant)
                return result
            # Under a dual-control rule: checked as the action itself, then stored, not done.
            request = second_person_request(actor, asked, action=action, object_type=target.object_type,
                                            object_id=target.object_id, tenant=tenant, reason=reason, seen=before)
        raise ConfirmationNeeded(request)
    except (Incomplete, Refused) as exc:
        _audit(actor, action, target.object_type, target.object_id, outcome=AuditOutcome.REFUSED, reason=reason,
               before=seen, message=str(exc), tenant=tenant)
        raise
    except (SagaError, LedgerError) as exc:
        message = str(exc)
        _audit(actor, action, target.object_type, target.object_id, outcome=AuditOutcome.REFUSED, reason=reason,
               before=seen, message=message, tenant=tenant)
        raise Refused(message) from exc
    finally:
        _acting.reset(acting)


def _moved_since_request(object_type: str, now: dict[str, Any]) -> str:
    """When confirming a dual-control request: what changed in the object since the requester's
    check (its fence, version, last change...), or "" (also outside a confirmation). Its state
    alone could be the same again (FAILED, retried, FAILED) over a different run."""
    seen = seen_at_request()
    if not seen:
        return ""
    now_json = json.loads(json.dumps(now, default=str))
    changed = sorted(key for key in set(seen) | set(now_json) if seen.get(key) != now_json.get(key))
    if not changed:
        return ""
    return (f"This {object_type} changed since the request was made ({', '.join(changed)}; it was "
            f"{seen.get('state')}, it is {now_json.get('state')}), so the request's action was not done: ask again "
            f"if it is still needed.")


def second_person_request(actor: Actor, asked: Asked, *, action: str, object_type: str, object_id: Any, tenant: str,
                          reason: str, seen: Any) -> DualControlRequest:
    """Store ``asked`` for a second person (dual control) and its audit entry ``dual.request``;
    call it inside the transaction that checked the action (holding the object's lock), then
    raise ``ConfirmationNeeded``. ``Refused`` when the same action on the object already waits
    (a double submit, or a second operator asking again): one request, one confirmation."""
    waiting = DualControlRequest.objects.filter(
        state=DualState.PENDING, deadline__gt=timezone.now(), object_type=object_type, object_id=str(object_id),
        act=asked.act).first()
    if waiting is not None:
        raise Refused(f"Request #{waiting.pk} ({waiting.summary}, asked by {waiting.requested_by_label}) already waits "
                      f"for a second person until {waiting.deadline:%Y-%m-%d %H:%M} UTC; confirm, refuse or withdraw "
                      f"it in the approvals inbox. Nothing was changed.", states_now=True)
    request = DualControlRequest.objects.create(
        action=action, policy=asked.policy, act=asked.act, params=asked.params, object_type=object_type,
        object_id=str(object_id), tenant=tenant, summary=clip_text(asked.summary, 300),
        seen=json.loads(json.dumps(seen, default=str)),
        requested_by=actor.user, requested_by_label=actor.label, reason=clip_text(reason),
        deadline=timezone.now() + deadline_after(),
    )
    _audit(actor, "dual.request", object_type, object_id, outcome=AuditOutcome.OK, reason=reason, before=seen,
           tenant=tenant, after={"request": request.pk, "action": action, "summary": request.summary,
                                 "deadline": request.deadline.isoformat()})
    changed(request)
    return request


def at_time(when: datetime | None) -> str:
    """`` at 2026-01-02 03:04:05 UTC``, for the messages that say when something happened."""
    return f" at {when:%Y-%m-%d %H:%M:%S} UTC" if when else ""

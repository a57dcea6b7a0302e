"""Dual control: a dangerous action one person asks for is done only once a second person
confirms it, with a reason, before a deadline.

Which actions, for which tenants, is a setting (``SAGA_DUAL_CONTROL``, docs/operations/dual-control.md)::

    SAGA_DUAL_CONTROL = {
        "run.compensate": "*",                 # every tenant (cancelling with compensation too)
        "effect.resolve_unsafe": ["acme"],     # resolving an effect as not executed or failed
        "run.fork": "*", "run.move": "*", "run.redrive": "*", "run.pause": "*",   # the repair actions
        "bulk": "*",                           # a bulk batch of at least SAGA_DUAL_CONTROL_BULK_ITEMS
    }

How it fits the frame of every action (``actions.perform``): an action function marked
``@dual_controlled`` says which rule covers it; ``perform`` checks the tenant, the role and
the state the requester saw exactly as for the action itself, then, when the rule applies
and this is not a confirmation, stores the request (the action, its arguments, the state
seen) with an audit entry ``dual.request`` in the same transaction, and raises
``ConfirmationNeeded``. Nothing else changes.

``dual_confirm`` (another person, a reason, before the deadline) runs the stored action as the
confirmer: the confirmer's tenants and role are checked, and the state the requester saw must
still hold (a run that moved on since is refused, and the request marked FAILED). The action's
own audit entry, the ``dual.confirm`` entry and the request's new state are written in one
transaction. ``dual_refuse`` ends a request with a reason; ``dual_withdraw`` is the
requester's own. A request past its deadline is EXPIRED and can no longer be confirmed.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.storage import is_storage_error
from operators import roles
from operators.models import AuditOutcome, DualControlRequest, DualState
from operators.selectors.tenancy import may_see, scope
from operators.services.actions import Actor, Denied, Incomplete, Refused, audit_entry
from operators.services.dual_rules import ConfirmationNeeded, DualRefused, act_named, changed, confirming
from operators.services.limits import clip_text
from operators.services.tenancy import NotFound

log = logging.getLogger("operators.dual")

__all__ = ["ConfirmationNeeded", "DualRefused", "dual_confirm", "dual_open", "dual_refuse", "dual_withdraw"]

REASON_NEEDED = "A reason is required: it goes into the audit log next to the request's. Nothing was changed."


def person_of(user: Any) -> int:
    """Who is behind ``user``: for an API key's user, the person who made the key (when the
    console made it: ``created_by``), else the user. A person's keys and their own login are
    one person for dual control, so none of them confirms another's request."""
    try:
        key = user.api_key  # the API key this user stands for (api.models.ApiKey), if any
    except ObjectDoesNotExist:
        return int(user.pk)
    return int(key.created_by_id or user.pk)


def same_person(one: Any, other: Any) -> bool:
    return one.pk == other.pk or person_of(one) == person_of(other)


def dual_open(user: Any) -> QuerySet[DualControlRequest]:
    """The requests waiting for a second person that ``user`` may see (their tenants), soonest
    deadline first; those past their deadline are left out (the sweeper's pass marks them
    EXPIRED, and a decision on one expires it first): a page or a live push writes nothing."""
    waiting = DualControlRequest.objects.filter(state=DualState.PENDING, deadline__gt=timezone.now())
    return scope(waiting, user).order_by("deadline", "id")


def expire_due() -> int:
    """Mark the requests past their deadline EXPIRED, each audited (``dual.expire`` by the system)
    in its own transaction; rows another process holds are left for the next call. How many."""
    done = 0
    for request_id in DualControlRequest.objects.filter(state=DualState.PENDING, deadline__lte=timezone.now()
                                                        ).values_list("pk", flat=True)[:500]:
        done += _expire_if_due(request_id, skip_locked=True)
    return done


def _expire_if_due(request_id: int, *, skip_locked: bool = False) -> bool:
    """Expire request ``request_id`` if it is PENDING past its deadline, with its audit entry, in
    a transaction of its own (committed whatever the caller does next)."""
    with transaction.atomic():
        request = (DualControlRequest.objects.select_for_update(skip_locked=skip_locked)
                   .filter(pk=request_id, state=DualState.PENDING, deadline__lte=timezone.now()).first())
        if request is None:
            return False
        _end(request, DualState.EXPIRED, result=f"not confirmed before {request.deadline:%Y-%m-%d %H:%M} UTC")
        audit_entry(Actor(user=None, ip=None, system="dual control"), "dual.expire",  # type: ignore[arg-type]
                    request.object_type, request.object_id, outcome=AuditOutcome.OK, tenant=request.tenant,
                    after=_as_after(request))
        return True


def _as_after(request: DualControlRequest) -> dict[str, Any]:
    return {"request": request.pk, "action": request.action, "summary": request.summary, "state": request.state,
            "requested_by": request.requested_by_label, "result": request.result}


def _end(request: DualControlRequest, state: str, *, actor: Actor | None = None, reason: str = "",
         result: str = "") -> None:
    request.state = state
    request.decided_at = timezone.now()
    if actor is not None:
        request.decided_by = actor.user
        request.decided_by_label = actor.label
    request.decision_reason = clip_text(reason)
    request.result = clip_text(result)
    request.save(update_fields=["state", "decided_at", "decided_by", "decided_by_label", "decision_reason", "result"])
    changed(request)


def _locked_open(actor: Actor, request_id: int, *, verb: str, reason: str) -> DualControlRequest:
    """The request, locked, still PENDING and within its deadline; else ``DualRefused`` (audited)."""
    request = DualControlRequest.objects.select_for_update().filter(pk=request_id).first()
    if request is None or not may_see(actor.user, request.tenant):
        raise NotFound(f"no request #{request_id}")
    if request.state == DualState.PENDING and request.deadline <= timezone.now():  # since _expire_if_due
        raise DualRefused(f"Request #{request.pk} is past its deadline ({request.deadline:%Y-%m-%d %H:%M} UTC); it "
                          f"can no longer be {verb}. Nothing was changed.")
    if request.state != DualState.PENDING:
        by = f" by {request.decided_by_label}" if request.decided_by_label else ""
        raise DualRefused(f"Request #{request.pk} is {request.state.lower()}{by}; it can no longer be {verb}. "
                          f"Nothing was changed.")
    return request


def _refusal(actor: Actor, action: str, request_id: int, exc: Exception, reason: str) -> None:
    """Audit a refused confirm/refuse/withdraw in its own transaction."""
    request = DualControlRequest.objects.filter(pk=request_id).first()
    if request is None:
        return
    audit_entry(actor, action, request.object_type, request.object_id, outcome=AuditOutcome.REFUSED, reason=reason,
           message=str(exc), tenant=request.tenant, after={"request": request.pk})


def dual_confirm(actor: Actor, *, request_id: int, reason: str) -> Any:
    """Confirm request ``request_id`` as ``actor`` (not its requester) and do its action now, as
    ``actor``: the action's answer. ``DualRefused`` when it cannot be confirmed; the action's own
    refusals (``Denied``, ``Refused``) when the confirmer may not do it or the object moved on
    since it was requested (the request is then FAILED, nothing else changed)."""
    if not reason.strip():
        raise Incomplete(REASON_NEEDED)
    _expire_if_due(request_id)
    try:
        with transaction.atomic():
            request = _locked_open(actor, request_id, verb="confirmed", reason=reason)
            if same_person(request.requested_by, actor.user):
                raise DualRefused(f"You asked for request #{request.pk}: another person must confirm it. "
                                  f"Nothing was changed.", forbidden=True)
            if not roles.can(actor.user, request.action):
                raise Denied(f"{actor.label} may not confirm {request.action.replace('.', ' ')}: it needs the "
                             f"{roles.ACTION_ROLES[request.action]} role")
            confirmer = Actor(user=actor.user, ip=actor.ip, system=actor.system)
            # The action's frame audits its own refusals (kept: the savepoint is committed then) and
            # refuses an object that changed since the request (``seen``), not only one in another state.
            savepoint = transaction.savepoint()
            try:
                with confirming(request.seen if isinstance(request.seen, dict) else {}):
                    result = act_named(request.act)(confirmer, **request.params)
            except (Refused, Incomplete, Denied, NotFound) as exc:
                transaction.savepoint_commit(savepoint)
                failed: Exception = exc
            except Exception as exc:  # an object gone, stored arguments the code no longer takes...
                transaction.savepoint_rollback(savepoint)
                if is_storage_error(exc):
                    raise  # our storage failing is not the request failing: it stays PENDING
                log.exception("dual control: request #%s's action %s failed", request.pk, request.act)
                failed = Refused(f"the action could not be done ({type(exc).__name__}: {str(exc)[:300]})")
            else:
                transaction.savepoint_commit(savepoint)
                _end(request, DualState.CONFIRMED, actor=actor, reason=reason, result=_said(result))
                audit_entry(actor, "dual.confirm", request.object_type, request.object_id, outcome=AuditOutcome.OK,
                       reason=reason, tenant=request.tenant, after=_as_after(request))
                return result
            _end(request, DualState.FAILED, actor=actor, reason=reason, result=str(failed))
            audit_entry(actor, "dual.confirm", request.object_type, request.object_id, outcome=AuditOutcome.REFUSED,
                   reason=reason, message=str(failed), tenant=request.tenant, after=_as_after(request))
    except (DualRefused, Denied) as exc:
        _refusal(actor, "dual.confirm", request_id, exc, reason)
        raise
    if isinstance(failed, (Denied, NotFound)):
        raise failed
    raise Refused(f"Request #{request_id} was confirmed, but the action was refused: {failed}", states_now=True)


def _said(result: Any) -> str:
    if result is None:
        return "done"
    if getattr(result, "id", None) is not None:
        return f"done: {type(result).__name__} {result.id}"
    return clip_text(str(result), 500)


def dual_refuse(actor: Actor, *, request_id: int, reason: str) -> DualControlRequest:
    """Refuse request ``request_id`` (anyone who could confirm it; a reason is required)."""
    if not reason.strip():
        raise Incomplete(REASON_NEEDED)
    _expire_if_due(request_id)
    try:
        with transaction.atomic():
            request = _locked_open(actor, request_id, verb="refused", reason=reason)
            if same_person(request.requested_by, actor.user):
                raise DualRefused(f"You asked for request #{request.pk}: withdraw it instead.", forbidden=True)
            if not roles.can(actor.user, request.action):
                raise Denied(f"{actor.label} may not refuse {request.action.replace('.', ' ')}: it needs the "
                             f"{roles.ACTION_ROLES[request.action]} role")
            _end(request, DualState.REFUSED, actor=actor, reason=reason)
            audit_entry(actor, "dual.refuse", request.object_type, request.object_id, outcome=AuditOutcome.OK,
                   reason=reason, tenant=request.tenant, after=_as_after(request))
            return request
    except (DualRefused, Denied) as exc:
        _refusal(actor, "dual.refuse", request_id, exc, reason)
        raise


def dual_withdraw(actor: Actor, *, request_id: int, reason: str = "") -> DualControlRequest:
    """The requester takes back their own request."""
    _expire_if_due(request_id)
    try:
        with transaction.atomic():
            request = _locked_open(actor, request_id, verb="withdrawn", reason=reason)
            if request.requested_by_id != actor.user.pk:
                raise DualRefused(f"Only {request.requested_by_label}, who asked, may withdraw request "
                                  f"#{request.pk}; refuse it instead.", forbidden=True)
            _end(request, DualState.WITHDRAWN, actor=actor, reason=reason)
            audit_entry(actor, "dual.withdraw", request.object_type, request.object_id, outcome=AuditOutcome.OK,
                   reason=reason, tenant=request.tenant, after=_as_after(request))
            return request
    except DualRefused as exc:
        _refusal(actor, "dual.withdraw", request_id, exc, reason)
        raise

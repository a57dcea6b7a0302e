"""Dual control: the requests waiting for a second person, and confirming, refusing or
withdrawing one (``operators.services.dual``). An action a rule covers answers 202 with the
request it stored (``DualOut``) instead of doing it."""

from __future__ import annotations

from typing import Any

from ninja import Field, Router, Schema

from api.auth import ApiRequest
from api.errors import Problem
from api.routes.common import SAID, Text, console_action
from api.routes.runs import actor_of
from operators import roles
from operators.models import DualControlRequest
from operators.services.dual import DualRefused, dual_confirm, dual_open, dual_refuse, dual_withdraw

router = Router(tags=["dual control"])


class DualOut(Schema):
    id: int
    action: str = Field(..., description="the action asked for (run.compensate, effect.resolve, run.fork ...)")
    rule: str = Field(..., description="the SAGA_DUAL_CONTROL rule that asked for a second person")
    object_type: str
    object_id: str
    tenant: str
    summary: str = Field(..., description="what will happen, in words")
    requested_by: str
    reason: str
    created_at: str
    deadline: str = Field(..., description="after it, the request can no longer be confirmed (EXPIRED)")
    state: str = Field(..., description="PENDING, CONFIRMED, FAILED, REFUSED, WITHDRAWN or EXPIRED")
    decided_by: str
    result: str = Field(..., description="what the action answered once confirmed, or why it was refused")


def dual_out(r: DualControlRequest) -> dict[str, Any]:
    return {"id": r.pk, "action": r.action, "rule": r.policy, "object_type": r.object_type, "object_id": r.object_id,
            "tenant": r.tenant, "summary": r.summary, "requested_by": r.requested_by_label, "reason": r.reason,
            "created_at": r.created_at.isoformat(), "deadline": r.deadline.isoformat(), "state": r.state,
            "decided_by": r.decided_by_label, "result": r.result}


class DecisionIn(Schema):
    reason: str = Field(..., min_length=1, max_length=4000, pattern=SAID,
                        description="goes into the audit log (required)")


class WithdrawIn(Schema):
    reason: Text = Field("", max_length=4000)


@router.get("", response=list[DualOut], summary="Requests waiting for a second person")
def list_requests(request: ApiRequest) -> list[dict[str, Any]]:
    """The key's tenants' requests still PENDING, soonest deadline first (at most 500)."""
    if not roles.can_view(request.user):
        raise Problem("forbidden", "a role is needed to see requests")
    return [dual_out(r) for r in dual_open(request.user)[:500]]


def _decided(request: ApiRequest, request_id: int, do: Any, reason: str) -> dict[str, Any]:
    try:
        with console_action("request", request_id):
            do(actor_of(request), request_id=request_id, reason=reason)
    except DualRefused as exc:
        raise Problem("second-person" if exc.forbidden else "conflict", str(exc)) from None
    return dual_out(DualControlRequest.objects.get(pk=request_id))


@router.post("/{request_id}/confirm", response=DualOut, summary="Confirm a request: its action is done now")
def confirm(request: ApiRequest, request_id: int, body: DecisionIn) -> dict[str, Any]:
    """Done as the confirming key, which must not be the requester's (403) and needs the action's
    role and tenant. 409 when the request is no longer PENDING (expired, decided, withdrawn) or
    when its object moved on since it was asked for (the request is then FAILED)."""
    return _decided(request, request_id, dual_confirm, body.reason)


@router.post("/{request_id}/refuse", response=DualOut, summary="Refuse a request: nothing is done")
def refuse(request: ApiRequest, request_id: int, body: DecisionIn) -> dict[str, Any]:
    return _decided(request, request_id, dual_refuse, body.reason)


@router.post("/{request_id}/withdraw", response=DualOut, summary="Withdraw your own request")
def withdraw(request: ApiRequest, request_id: int, body: WithdrawIn) -> dict[str, Any]:
    return _decided(request, request_id, dual_withdraw, body.reason)

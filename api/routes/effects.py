"""Ambiguous effects: list the UNKNOWN ones, resolve one with evidence (as in the console)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from ninja import Field, Query, Router, Schema

from api.auth import ApiRequest
from api.errors import Problem
from api.routes.common import INT_CURSOR, MAX_PAGE, Text, console_action, int_id_of, next_link, one_of, parse_cursor
from api.routes.runs import actor_of
from ledger.models import EffectRecord, EffectStatus
from operators.selectors.paging import keyset_page
from operators.selectors.queues import effects_ambiguous
from operators.services.queues import effect_manual_resolve

router = Router(tags=["effects"])
OPEN = (EffectStatus.UNKNOWN, EffectStatus.IN_PROGRESS)


class EffectQuery(Schema):
    status: str = Field("", max_length=40, pattern=one_of(OPEN),
                        description="UNKNOWN, or IN_PROGRESS (stuck: no worker holds its run); default: both")
    connector: str = Field("", max_length=200)
    cursor: str = Field("", max_length=100, pattern=INT_CURSOR)
    limit: int = Field(50, ge=1, le=MAX_PAGE)


class EffectOut(Schema):
    id: int
    run_id: str
    tenant: str
    step: str
    connector: str
    kind: str
    status: str
    idempotency_key: str
    attempts: int
    error: str = Field("", description="what the last attempt said")
    intent_at: datetime
    dispatched_at: datetime | None
    downstream_ref: str
    resolution: str
    resolved_by: str
    resolved_at: datetime | None


class EffectList(Schema):
    items: list[EffectOut] = Field(..., description="oldest intent first")
    cursor: str | None = None
    next: str | None = None


class ResolveIn(Schema):
    outcome: Literal["succeeded", "not_executed", "failed"] = Field(
        ..., description="succeeded (give `downstream_ref`), not_executed (retried with the same key), failed")
    downstream_ref: Text = Field("", max_length=300, description="the provider's reference (required to say "
                                                                 "succeeded)")
    note: Text = Field(..., max_length=4000, description="the evidence (required): what you checked")
    expected: str = Field("", max_length=40, description="the effect's status you saw (required), e.g. UNKNOWN")


def effect_out(e: EffectRecord) -> dict[str, Any]:
    error = f"{e.error_class}: {e.error_message}" if e.error_class else e.error_message
    return {"id": e.id, "run_id": str(e.run_id), "tenant": e.tenant, "step": e.step_name, "connector": e.connector,
            "kind": e.kind, "status": e.status, "idempotency_key": e.idempotency_key, "attempts": e.attempts,
            "error": error, "intent_at": e.intent_at, "dispatched_at": e.dispatched_at,
            "downstream_ref": e.downstream_ref, "resolution": e.resolution, "resolved_by": e.resolved_by_label,
            "resolved_at": e.resolved_at}


@router.get("", response=EffectList, summary="Effects whose outcome nobody knows, of the key's tenants")
def list_effects(request: ApiRequest, query: Query[EffectQuery]) -> dict[str, Any]:
    status = query.status.strip().upper()
    if status and status not in OPEN:
        raise Problem("validation", f"status must be one of {', '.join(OPEN)} (settled effects are not a queue)")
    qs = effects_ambiguous(user=request.user).defer("request_payload", "result")
    if status:
        qs = qs.filter(status=status)
    if query.connector.strip():
        qs = qs.filter(connector=query.connector.strip().replace("\x00", ""))
    page = keyset_page(qs, field="intent_at", descending=False, cursor=parse_cursor(query.cursor, key=int),
                       size=query.limit)
    return {"items": [effect_out(e) for e in page.items], "cursor": page.next_cursor,
            "next": next_link(request, "cursor", page.next_cursor)}


@router.post("/{effect_id}/resolve", response=EffectOut, summary="Resolve an ambiguous effect by hand, with evidence")
def resolve(request: ApiRequest, effect_id: str, body: ResolveIn) -> dict[str, Any]:
    pk = int_id_of(effect_id, "effect")
    with console_action("effect", pk):
        effect_manual_resolve(actor_of(request), effect_id=pk, outcome=body.outcome,
                              downstream_ref=body.downstream_ref.strip(), note=body.note,
                              expected=body.expected.strip().upper() or None)
    return effect_out(EffectRecord.objects.get(id=pk))

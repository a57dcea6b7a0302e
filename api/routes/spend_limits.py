"""Tenants' daily spend limits (``ledger.flow.spend``): each limit with what its tenant spent today
(UTC) and the runs parked at it, as the console's connectors page shows them; set, change or
remove one (``operators.services.connectors.connector_spend_limit_act``: the operator role, a
tenant the key sees, the every-tenant limit ``*`` only for a key that sees every tenant, the limit
the caller saw, the audit entry in the change's transaction).

A limit is named in the path by its tenant and connector: a name holding a ``/`` cannot be
reached here (the Python API, ``ledger.set_spend_limit``, takes any name). Removing is a PUT of
``per_day: null`` rather than a DELETE, since it carries a reason and the limit seen, and some
clients and proxies drop a DELETE's body.
"""

from __future__ import annotations

import math
from datetime import date, datetime
from decimal import Decimal
from typing import Annotated, Any

from ninja import Field, Path, Router, Schema
from pydantic import BeforeValidator, WithJsonSchema

from api.auth import ApiRequest
from api.errors import Problem
from api.routes.common import Text, console_action, name_pattern
from api.routes.runs import actor_of
from ledger.flow.selectors import SpendLimitState
from ledger.flow.services import (
    MAX_SPEND,
    SPEND_CONNECTOR_CHARS,
    SPEND_DECIMALS,
    SPEND_TENANT_CHARS,
    InvalidFlowSetting,
    spend_names_checked,
    spend_per_day,
)
from operators.services.connectors import connector_spend_limit_act, spend_limits_seen, spend_whose

router = Router(tags=["spend limits"])


class TenantSpendOut(Schema):
    tenant: str
    spent_today: float = Field(..., description="usd spent today (UTC) on the connector")
    runs_parked: int = Field(..., description="its runs parked at the limit (NEEDS_ATTENTION, spend_limit)")
    reached: bool = Field(..., description="spent_today is at or over the limit: its next call parks its run")


class SpendLimitOut(Schema):
    tenant: str = Field(..., description='the tenant, or "*": every tenant without a limit of its own, each counted '
                                         'on its own')
    connector: str = Field(..., description='the connector it limits ("model": the model turns of run_agent)')
    per_day: float = Field(..., description="usd per UTC day")
    state: str = Field(..., description="per_day as written (`25`, `0.5`): what `expected` compares")
    day: date = Field(..., description="the UTC day spent_today is counted in")
    spent_today: float = Field(..., description="the tenant's spend today on the connector; for `*`, the most any "
                                                "tenant it applies to spent")
    reached: bool = Field(..., description="spent_today is at or over per_day: the next call parks its run")
    runs_parked: int = Field(..., description="runs parked at this limit (for `*`: of the tenants it applies to); "
                                              "they resume at the sweeper's next pass once under the limit")
    changed_by: str | None
    changed_at: datetime
    tenants: list[TenantSpendOut] | None = Field(..., description="for `*`: the tenants it applies to that spent "
                                                                  "today or have runs parked, most spent first; "
                                                                  "null for a tenant's own limit")


def _float_noise_off(value: Any) -> Any:
    """A JSON number is a binary float: 0.000003 may arrive as 3.0000000000000004e-06. Within
    1e-9 of a value with ``SPEND_DECIMALS`` places, it is that value; text ("0.5") is taken as
    written, and a number further off keeps its places (and is refused for them)."""
    if isinstance(value, float) and math.isfinite(value):
        near = round(value, SPEND_DECIMALS)
        if abs(near - value) <= 1e-9:
            return Decimal(f"{near:.{SPEND_DECIMALS}f}")
    return value


# What the schema says of an amount: text with at most SPEND_DECIMALS places, or a number up to
# MAX_SPEND in steps of 10^-SPEND_DECIMALS.
_AMOUNT_SCHEMA = {"anyOf": [
    {"type": "number", "minimum": 0, "maximum": float(MAX_SPEND),
     "multipleOf": float(Decimal(1).scaleb(-SPEND_DECIMALS))},
    {"type": "string", "pattern": rf"^[0-9]{{1,8}}(\.[0-9]{{1,{SPEND_DECIMALS}}})?$"},
    {"type": "null"},
]}


class SpendLimitIn(Schema):
    per_day: Annotated[Decimal | None, BeforeValidator(_float_noise_off), WithJsonSchema(_AMOUNT_SCHEMA)] = Field(
        ..., description=f"usd per UTC day, 0 to {MAX_SPEND} with at most "
                                                     f"{SPEND_DECIMALS} decimal places (a number, or its text such "
                                                     f"as \"0.5\"); null removes the limit")
    reason: Text = Field(..., min_length=1, max_length=4000, description="goes into the audit log")
    expected: str = Field("", max_length=40, description="the limit's `state` you saw (required), or `none` for no "
                                                         "limit: a limit set, changed or removed since (or this "
                                                         "request sent twice) is a 409 stale-state")


class SpendLimitDone(Schema):
    message: str
    limit: SpendLimitOut | None = Field(..., description="the limit now; null once removed")


def _limit_out(state: SpendLimitState) -> dict[str, Any]:
    return {**state.as_dict(), "state": state.state}


def _invalid(field: str, message: str) -> Problem:
    return Problem("validation", f"{field}: {message}; nothing was changed",
                   errors=[{"loc": ["body", "body", field] if field == "per_day" else ["path", field],
                            "msg": message}])  # as the schema's own


@router.get("", response=list[SpendLimitOut], summary="Every spend limit with today's spend")
def list_spend_limits(request: ApiRequest, tenant: str = "", connector: str = "") -> list[dict[str, Any]]:
    """Each daily spend limit the key may see, by connector then tenant (``*`` first): those of
    its tenants and the every-tenant ones (whose figures then count only its tenants), with what
    was spent today (UTC) and the runs parked at it. ``tenant``, ``connector``: only those."""
    return [_limit_out(s) for s in spend_limits_seen(request.user)
            if (not tenant or s.tenant == tenant) and (not connector or s.connector == connector)]


@router.put("/{tenant}/{connector}", response=SpendLimitDone,
            summary="Set, change or remove a tenant's daily spend limit on a connector")
def set_spend_limit(request: ApiRequest, body: SpendLimitIn,
                    tenant: str = Path(..., pattern=name_pattern(SPEND_TENANT_CHARS)),
                    connector: str = Path(..., pattern=name_pattern(SPEND_CONNECTOR_CHARS))) -> dict[str, Any]:
    """``per_day`` usd per UTC day for ``tenant`` (``*``: every tenant without its own) on
    ``connector``; ``per_day: null`` removes it. Runs parked at the limit resume at the
    sweeper's next pass once their tenant's spend today is under it.

    400 ``validation`` naming the field (``errors[].loc``) for an amount that is not a number,
    negative, over the maximum or with too many decimal places, or a name that cannot be one,
    with nothing changed and nothing audited; 403 ``forbidden`` (audited) for a key without the
    operator role, for a tenant the key does not see, and for ``*`` unless the key sees every
    tenant; 409 ``stale-state`` (audited) when the limit in force is not ``expected``, 409
    ``conflict`` for removing a limit that is not there."""
    try:
        per_day = None if body.per_day is None else spend_per_day(body.per_day, label="per_day")
    except InvalidFlowSetting as exc:
        raise _invalid("per_day", str(exc).removeprefix("per_day ")) from None
    try:
        spend_names_checked(tenant=tenant, connector=connector)
    except InvalidFlowSetting as exc:
        raise _invalid("tenant" if "tenant" in str(exc) else "connector", str(exc)) from None
    with console_action("spend limit", f"{tenant}/{connector}"):
        connector_spend_limit_act(actor_of(request), tenant=tenant, connector=connector, per_day=per_day,
                                  reason=body.reason, expected=body.expected.strip() or None)
    now = next((s for s in spend_limits_seen(request.user) if (s.tenant, s.connector) == (tenant, connector)), None)
    whose = spend_whose(tenant)
    if per_day is None:
        message = f"{whose} has no daily spend limit on {connector} any more"
    else:
        message = f"{whose}'s daily spend limit on {connector} is now {now.state if now else per_day} usd"
    return {"message": message, "limit": _limit_out(now) if now is not None else None}


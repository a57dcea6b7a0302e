"""Connectors' flow control: each connector's limits, pause and circuit, as the console's connectors
page shows them; pause, resume and change the limits (``operators.services.connectors``: the
operator role, a key that sees every tenant, the state the caller saw, the audit entry in the
change's transaction). A connector is named in the path: a name with a ``/`` cannot be reached
here (the Python API, ``ledger.pause_connector`` and the others, takes any name)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Field, Router, Schema
from pydantic import BeforeValidator, ConfigDict

from api.auth import ApiRequest
from api.errors import Problem
from api.routes.common import Text, console_action, integral_float
from api.routes.runs import actor_of
from core.redaction import redact_text
from ledger.flow.selectors import ConnectorState, connector_state, connector_states
from ledger.flow.services import KEY_FIELD, KEY_FIELD_CHARS, MAX_COUNT, MAX_RATE, InvalidFlowSetting, Limits
from ledger.models import ConnectorFlow
from operators.selectors.tenancy import tenants_of
from operators.services.connectors import connector_limits_act, connector_pause_act, connector_resume_act

router = Router(tags=["connectors"])
CHANGES = 20  # circuit changes a connector's page shows
LIMIT_FIELDS = ("rate", "burst", "max_in_flight", "key_field", "circuit_failures", "circuit_window_seconds",
                "circuit_cooldown_seconds")


class LimitsOut(Schema):
    rate: float | None = Field(..., description="calls per second; null: no rate limit")
    burst: int = Field(..., description="calls that may go at once after a quiet spell")
    max_in_flight: int | None = Field(..., description="calls out at once; null: no limit")
    key_field: str = Field(..., description='what the limits are kept per: "" one set for the connector, '
                                            '"tenant", or a payload field')
    circuit_failures: int = Field(..., description="consecutive retryable failures or timeouts that open the "
                                                   "circuit; 0: no breaker")
    circuit_window_seconds: float = Field(..., description="... counted within this many seconds of the first")
    circuit_cooldown_seconds: float = Field(..., description="open this long, then one trial call")


class PausedOut(Schema):
    at: datetime
    by: str
    reason: str


class CircuitOut(Schema):
    state: str = Field(..., description="closed, half_open or open: the worst of its keys'")
    failures: int = Field(..., description="consecutive failures counted (of the key shown)")
    opened_at: datetime | None
    keys_open: int = Field(..., description="keys whose circuit is not closed (limits kept per key)")


class LastMinutesOut(Schema):
    minutes: int
    ended: int = Field(..., description="calls that ended in the window")
    failed: int = Field(..., description="... that failed for good")
    error_rate: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None


class ConnectorOut(Schema):
    connector: str
    state: str = Field(..., description="running or paused: what `expected` compares")
    limits: LimitsOut = Field(..., description="in force now")
    declared: LimitsOut | None = Field(..., description="what the connector's class declares")
    limits_changed_by: str | None = Field(..., description="who set the limits in force; null: the declared ones")
    limits_changed_at: datetime | None
    limits_version: str = Field(..., description="changes whenever the limits do")
    paused: PausedOut | None
    in_flight: int = Field(..., description="calls out now")
    waiting: int = Field(..., description="calls held by flow control, never sent")
    let_go: int = Field(..., description="held calls let go, about to be sent")
    circuit: CircuitOut
    last_minutes: LastMinutesOut


class CircuitChangeOut(Schema):
    at: datetime
    state: str = Field(..., description="open, half_open or closed")
    key: str | None = Field(..., description="the key whose circuit it is (\"\": the connector's one); null for a "
                                             "key limited to some tenants")
    failures: int = Field(..., description="the failures counted when it opened")
    error: str | None = Field(..., description="the failure that opened it (redacted); null for a key limited "
                                               "to some tenants")


class ConnectorDetailOut(ConnectorOut):
    changes: list[CircuitChangeOut] = Field(..., description=f"its circuit's latest {CHANGES} changes, newest "
                                                             f"first")


class ConnectorDone(Schema):
    message: str
    connector: ConnectorOut


EXPECTED = Field("", max_length=40, description="the connector's `state` you saw (required): `running` to pause, "
                                                "`paused` to resume; a connector paused or resumed meanwhile is "
                                                "a 409 stale-state")
REASON = Field(..., min_length=1, max_length=4000, description="goes into the audit log")


class ActIn(Schema):
    reason: Text = REASON
    expected: str = EXPECTED


Count1 = Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT), BeforeValidator(integral_float)]
Count0 = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT), BeforeValidator(integral_float)]
NOT_NULL = ("burst", "key_field", "circuit_failures", "circuit_window_seconds", "circuit_cooldown_seconds")


def _every_limit_or_declared(schema: dict[str, Any]) -> None:
    """The schema says what ``_limits`` refuses: ``declared: true`` and no limit, or every limit,
    null only where it means "no such limit" (rate, max_in_flight)."""
    for name in NOT_NULL:
        prop = schema["properties"][name]
        typed = [option for option in prop.pop("anyOf", []) if option.get("type") != "null"]
        prop.update(typed[0] if typed else {})
        prop.pop("default", None)
    schema["oneOf"] = [
        {"required": ["declared"], "properties": {"declared": {"const": True}},
         "not": {"anyOf": [{"required": [name]} for name in LIMIT_FIELDS]}},
        {"required": list(LIMIT_FIELDS), "properties": {"declared": {"const": False}}},
    ]


class LimitsIn(Schema):
    """Every limit (as GET shows them under ``limits``), or ``declared: true`` and none."""

    model_config = ConfigDict(json_schema_extra=_every_limit_or_declared)

    declared: bool = Field(False, description="true: back to what the connector's class declares, which it "
                                              "then follows (send no limit with it)")
    rate: float | None = Field(None, ge=0.001, le=MAX_RATE, allow_inf_nan=False,
                               description="calls per second; null: no rate limit")
    burst: Count1 | None = None
    max_in_flight: Count1 | None = Field(None, description="null: no limit")
    key_field: str | None = Field(None, max_length=KEY_FIELD_CHARS, pattern=f"^{KEY_FIELD.pattern}$",
                                  description='"", "tenant" or a payload field (letters, digits, . _ -)')
    circuit_failures: Count0 | None = Field(None, description="0: no breaker")
    circuit_window_seconds: float | None = Field(None, ge=0.1, le=86_400, allow_inf_nan=False)
    circuit_cooldown_seconds: float | None = Field(None, ge=0.1, le=86_400, allow_inf_nan=False)
    reason: Text = REASON
    expected: str = Field("", max_length=40, description="the connector's `state` you saw (required); a pause "
                                                         "or resume meanwhile is a 409 stale-state")
    limits_version: str = Field("", pattern=r"^[0-9a-f]{0,40}$",
                                description="the `limits_version` you saw (recommended): limits someone changed "
                                            "since, or this request sent twice, are a 409 stale-state")


def _connector_out(state: ConnectorState) -> dict[str, Any]:
    return {**state.as_dict(), "declared": state.declared or None, "limits_version": state.limits_version}


def _not_found(name: str) -> Problem:
    return Problem("not-found", f"no connector named {name[:200]!r} has flow control here (a connector has it "
                                f"once a worker that registers it has started)")


def _state(name: str) -> ConnectorState:
    found = connector_state(name, changes=CHANGES)
    if found is None:
        raise _not_found(name)
    return found


def _exists(name: str) -> None:
    """404 before acting on a name without flow control (its rows are never deleted)."""
    if not ConnectorFlow.objects.filter(connector=name).exists():
        raise _not_found(name)


def _invalid(field: str, message: str) -> Problem:
    return Problem("validation", f"{field}: {message}; nothing was changed",
                   errors=[{"loc": ["body", "body", field], "msg": message}])  # as the schema's own


def _limits(body: LimitsIn) -> Limits | None:
    """The limits ``body`` sets (None: the declared ones), each value checked as the service
    checks it, or a validation problem naming the field."""
    given = [f for f in LIMIT_FIELDS if f in body.model_fields_set]
    if body.declared:
        if given:
            raise _invalid(given[0], "send no limit with `declared: true`")
        return None
    missing = [f for f in LIMIT_FIELDS if f not in given]
    if missing:
        raise _invalid(missing[0], "required (send every limit, null for no such limit, or `declared: true`)")
    values = {f: getattr(body, f) for f in LIMIT_FIELDS}
    for field in NOT_NULL:
        if values[field] is None:
            raise _invalid(field, "must not be null")
    # One value at a time against valid ones, so the problem names the field the service refuses.
    valid = Limits(rate=None, burst=1, max_in_flight=None, key_field="", circuit_failures=0,
                   circuit_window_seconds=60.0, circuit_cooldown_seconds=30.0).as_dict()
    for field in LIMIT_FIELDS:
        try:
            Limits(**{**valid, field: values[field]}).checked()
        except InvalidFlowSetting as exc:
            raise _invalid(field, str(exc)) from None
    return Limits(**values).checked()


@router.get("", response=list[ConnectorOut], summary="Every connector's flow control, by name")
def list_connectors(request: ApiRequest) -> list[dict[str, Any]]:
    """Limits, pause, circuit, calls out and waiting, and the last minutes' error rate and
    latency, of each connector with flow control (written when a worker that registers it starts)."""
    return [_connector_out(state) for state in connector_states()]


@router.get("/{name}", response=ConnectorDetailOut, summary="One connector's flow control and its circuit's history")
def get_connector(request: ApiRequest, name: str) -> dict[str, Any]:
    """As in the list, with the circuit's latest changes. The key and the error of a change may
    come from any tenant's call: a key limited to some tenants gets them as null. 404
    ``not-found`` for a name without flow control."""
    state = _state(name)
    every_tenant = tenants_of(request.user) is None
    changes = [{"at": c.at, "state": c.state, "failures": c.failures,
                "key": c.key if every_tenant else None,
                "error": redact_text(c.error) if every_tenant else None} for c in state.changes]
    return {**_connector_out(state), "changes": changes}


def _acted(name: str, message: str) -> dict[str, Any]:
    return {"message": message, "connector": _connector_out(_state(name))}


@router.post("/{name}/pause", response=ConnectorDone, summary="Pause a connector: hold its calls, unsent")
def pause_connector(request: ApiRequest, name: str, body: ActIn) -> dict[str, Any]:
    """Calls not sent yet wait (PENDING, never UNKNOWN; their runs suspend, holding no worker);
    calls already out finish; other connectors go on. The operator role and a key that sees every
    tenant (403 ``forbidden`` otherwise, audited); 404 ``not-found``; 409 ``stale-state`` when
    it is not in the ``expected`` state, 409 ``conflict`` when it is paused already; 400
    ``validation`` without ``expected`` or ``reason``."""
    _exists(name)
    with console_action("connector", name):
        connector_pause_act(actor_of(request), name=name, reason=body.reason, expected=body.expected.strip() or None)
    return _acted(name, "paused: its calls wait, unsent, until it is resumed")


@router.post("/{name}/resume", response=ConnectorDone, summary="Resume a paused connector")
def resume_connector(request: ApiRequest, name: str, body: ActIn) -> dict[str, Any]:
    """The calls that waited go, oldest first, at the connector's rate. As ``pause``: 403, 404,
    409 ``stale-state`` (send ``expected: paused``), 409 ``conflict`` when it is not paused, 400."""
    _exists(name)
    with console_action("connector", name):
        connector_resume_act(actor_of(request), name=name, reason=body.reason,
                             expected=body.expected.strip() or None)
    return _acted(name, "resumed: the calls that waited go at its rate")


@router.put("/{name}/limits", response=ConnectorDone, summary="Set a connector's limits, or put back the declared")
def set_limits(request: ApiRequest, name: str, body: LimitsIn) -> dict[str, Any]:
    """Every limit, as GET shows them under ``limits`` (``rate`` and ``max_in_flight`` null for
    none), or ``{"declared": true}`` for what the connector's class declares. Every worker applies
    them from its next dispatch; calls already out are not affected. 400 ``validation`` naming
    the field (``errors[].loc``) for a value missing, of the wrong type or out of range, with
    nothing changed and nothing audited; otherwise as ``pause``: 403 (audited), 404, 409
    ``stale-state`` (also when ``limits_version`` is not the limits' version any more)."""
    limits = _limits(body)
    _exists(name)
    seen = body.expected.strip()
    if seen and body.limits_version:
        seen = f"{seen} {body.limits_version}"  # what the operator action compares (state, then version)
    with console_action("connector", name):
        connector_limits_act(actor_of(request), name=name, limits=limits, reason=body.reason, expected=seen or None)
    return _acted(name, "limits back to the declared ones" if limits is None else "limits set")

"""Schedules (``sagas.schedules``): list and read them with their next fire times and last
ticks; create one; pause, resume, trigger now, backfill a range (with a preview), delete. Each
change goes through ``operators.services.schedules`` (the operator role, a tenant the key sees,
the schedule's row locked, the state seen, the audit entry in the change's transaction).

A schedule's name is letters, digits and ``. _ : -``, so it goes into the path as it is. Deleting
is a POST to ``/delete``: it carries a reason and the state seen, and some clients and proxies
drop a DELETE's body."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime, timedelta
from typing import Any

from ninja import Field, Query, Router, Schema
from pydantic import ConfigDict

from api.auth import ApiRequest
from api.errors import Problem
from api.routes.common import IsoDateTime, Text, choice, console_action
from api.routes.runs import actor_of
from operators import roles
from operators.selectors.tenancy import may_see, tenants_of
from operators.services.actions import Denied
from operators.services.schedules import (
    schedule_backfill_act,
    schedule_create_act,
    schedule_delete_act,
    schedule_pause_act,
    schedule_resume_act,
    schedule_trigger_act,
)
from sagas.errors import InvalidArgument, NotSerializable, WorkflowNotRegistered
from sagas.integration import (
    CATCH_UP_CHOICES,
    DEFAULT_BUSINESS_KEY,
    OVERLAP_CHOICES,
    ScheduleSpec,
    backfill_preview,
    definition_for,
    next_fire_times,
)
from sagas.integration import SCHEDULE_NAME as NAME
from sagas.models import Schedule, ScheduleTick

router = Router(tags=["schedules"])
NEXT_SHOWN = 5


class TickOut(Schema):
    tick_at: datetime
    outcome: str = Field(..., description="started, skipped, buffered, missed or failed")
    how: str = Field(..., description="schedule, catch_up, trigger or backfill")
    run_id: str | None
    note: str
    handled_at: datetime
    by: str = Field(..., description="who fired it by hand (trigger, backfill); empty for the sweeper")


class ScheduleOut(Schema):
    name: str
    workflow: str
    tenant: str
    cron: str | None
    timezone: str
    every_seconds: int | None
    input: Any
    business_key: str
    jitter_seconds: float
    catch_up: str
    catch_up_window_seconds: int
    overlap: str
    source: str = Field(..., description='"code" (declared in @workflow) or "api"')
    state: str = Field(..., description="active or paused: what `expected` compares")
    paused_reason: str
    next_fire_times: list[datetime] = Field(..., description="the next ticks (UTC); empty while paused")
    last_ticks: list[TickOut]


def _tick(t: ScheduleTick) -> dict[str, Any]:
    return {"tick_at": t.tick_at, "outcome": t.outcome, "how": t.how, "run_id": str(t.run_id) if t.run_id else None,
            "note": t.note, "handled_at": t.handled_at, "by": t.actor_label}


def _out(s: Schedule, *, ticks: int = 5) -> dict[str, Any]:
    next_times = next_fire_times(s, NEXT_SHOWN)
    last = ScheduleTick.objects.filter(schedule=s).order_by("-tick_at")[:ticks]
    return {
        "name": s.name, "workflow": s.workflow_name, "tenant": s.tenant, "cron": s.cron or None,
        "timezone": s.timezone, "every_seconds": int(s.every.total_seconds()) if s.every else None, "input": s.input,
        "business_key": s.business_key, "jitter_seconds": s.jitter.total_seconds(), "catch_up": s.catch_up,
        "catch_up_window_seconds": int(s.catch_up_window.total_seconds()), "overlap": s.overlap, "source": s.source,
        "state": "paused" if s.paused else "active", "paused_reason": s.paused_reason, "next_fire_times": next_times,
        "last_ticks": [_tick(t) for t in last],
    }


def _get(request: ApiRequest, name: str) -> Schedule:
    s = Schedule.objects.filter(name=name).first() if NAME.fullmatch(name) else None
    if s is None or not may_see(request.user, s.tenant):
        raise Problem("not-found", f"no schedule {name[:100]!r}")
    return s


@router.get("", response=list[ScheduleOut], summary="Every schedule the key may see, by name")
def list_schedules(request: ApiRequest) -> list[dict[str, Any]]:
    schedules = Schedule.objects.order_by("name")
    seen = tenants_of(request.user)
    if seen is not None:
        schedules = schedules.filter(tenant__in=seen)
    return [_out(s) for s in schedules]


@router.get("/{name}", response=ScheduleOut, summary="One schedule, with its last 50 ticks")
def get_schedule(request: ApiRequest, name: str) -> dict[str, Any]:
    return _out(_get(request, name), ticks=50)


# A business key template as ``checked`` takes it: literal text ({{ and }} for braces) and the
# fields {schedule}, {fire_time_utc} and {fire_time} (with a strftime format: {fire_time:%Y-%m-%d}),
# at least one of the tick's. A format that gives two ticks the same key ({fire_time:%Y} hourly) is
# still refused (400): that depends on the calendar.
_FORMAT = r"(?::[^{}\x00-\x1f\x7f-\x9f]*)?"  # no control character: a key is one line
_FIELD = rf"(?:[^{{}}\x00-\x1f\x7f-\x9f]|\{{\{{|\}}\}}|\{{schedule\}}|\{{fire_time_utc\}}|\{{fire_time{_FORMAT}\}})"
_TICK = rf"(?:\{{fire_time_utc\}}|\{{fire_time{_FORMAT}\}})"
_KEY_TEMPLATE = f"^{_FIELD}*{_TICK}{_FIELD}*$"


# The time zones this server knows (the system's tz database): the schema's enum, as checked.
ZONES: list[Any] = sorted(zoneinfo.available_timezones())


def _pattern_apart(schema: dict[str, Any]) -> None:
    schema["allOf"] = [{"pattern": schema.pop("pattern")}]


def _exactly_one_calendar(schema: dict[str, Any]) -> None:
    """The schema says what ``checked`` refuses: exactly one of a ``cron`` (not blank) and ``every_seconds``."""
    schema["oneOf"] = [
        {"required": ["cron"], "properties": {"cron": {"type": "string", "pattern": r"\S"}}},
        {"required": ["every_seconds"], "properties": {"every_seconds": {"type": "integer"}}},
    ]


class ScheduleIn(Schema):
    model_config = ConfigDict(json_schema_extra=_exactly_one_calendar)

    name: str = Field(..., min_length=1, max_length=200, pattern=f"^{NAME.pattern}$",
                      description="letters, digits and . _ : -")
    workflow: Text = Field(..., min_length=1, max_length=200)
    cron: Text | None = Field(None, max_length=200, description="five fields; give cron or every_seconds")
    timezone: str = Field("UTC", max_length=64, json_schema_extra={"enum": list(ZONES)},
                          description="an IANA name, such as Europe/Berlin")
    every_seconds: int | None = Field(None, ge=1, le=366 * 86400)
    input: Any = None
    tenant: Text = Field("default", min_length=1, max_length=100)
    # The pattern sits in an allOf beside maxLength: schemathesis' coverage phase made boundary-length
    # values of the two together that broke the pattern (4.32), and called their refusal a finding.
    business_key: str = Field(DEFAULT_BUSINESS_KEY, min_length=1, max_length=200, pattern=_KEY_TEMPLATE,
                              json_schema_extra=_pattern_apart,
                              description="{schedule}, {fire_time} and {fire_time_utc}; two ticks, two keys")
    jitter_seconds: float = Field(0, ge=0, le=3600)
    catch_up: str = Field("last", pattern=choice(CATCH_UP_CHOICES), description=" / ".join(CATCH_UP_CHOICES))
    catch_up_window_seconds: int = Field(3600, ge=0, le=31 * 86400)
    overlap: str = Field("skip", pattern=choice(OVERLAP_CHOICES), description=" / ".join(OVERLAP_CHOICES))
    reason: Text = Field("", max_length=4000, description="goes into the audit log")


@router.post("", response={201: ScheduleOut}, summary="Create a schedule")
def create_schedule(request: ApiRequest, body: ScheduleIn) -> tuple[int, dict[str, Any]]:
    """Its first tick is the first one after now. 409 if the name is taken; 400 for a malformed
    calendar, template or option; 404 (unknown-workflow) for a workflow the web process does not
    have."""
    if roles.can(request.user, "schedule.create"):  # (anyone else is refused and audited by the action)
        try:  # an unknown workflow first: what the schema cannot say (the calendar, the key) comes after
            definition_for(body.workflow, None)
        except WorkflowNotRegistered as exc:
            raise Problem("unknown-workflow", str(exc)) from None
    spec = ScheduleSpec(
        name=body.name, workflow=body.workflow, cron=body.cron or "", timezone=body.timezone,
        every=timedelta(seconds=body.every_seconds) if body.every_seconds else None, input=body.input,
        tenant=body.tenant, business_key=body.business_key, jitter=timedelta(seconds=body.jitter_seconds),
        catch_up=body.catch_up, catch_up_window=timedelta(seconds=body.catch_up_window_seconds), overlap=body.overlap,
    )
    try:
        made = schedule_create_act(actor_of(request), spec=spec, reason=body.reason)
    except Denied as exc:
        raise Problem("forbidden", str(exc)) from None
    except WorkflowNotRegistered as exc:
        raise Problem("unknown-workflow", str(exc)) from None
    except (InvalidArgument, NotSerializable) as exc:
        if "already a schedule" in str(exc):
            raise Problem("conflict", str(exc)) from None
        raise Problem("validation", str(exc)) from None
    return 201, _out(made)


class StateIn(Schema):
    reason: Text = Field(..., min_length=1, max_length=4000, description="goes into the audit log")
    expected: str = Field("", max_length=40, description="what you saw (required): `active` or `paused`; a "
                                                         "change meanwhile is a 409")


class ReasonIn(Schema):
    reason: Text = Field(..., min_length=1, max_length=4000, description="goes into the audit log")
    overlap: str | None = Field(None, pattern=choice(OVERLAP_CHOICES),
                                description="this tick's overlap policy; default: the schedule's")


@router.post("/{name}/pause", response=ScheduleOut, summary="Pause a schedule")
def pause_schedule(request: ApiRequest, name: str, body: StateIn) -> dict[str, Any]:
    """Ticks that fall while it is paused are not fired (a backfill can fire them)."""
    with console_action("schedule", name):
        schedule_pause_act(actor_of(request), name=name, reason=body.reason, expected=body.expected.strip() or None)
    return _out(_get(request, name))


@router.post("/{name}/resume", response=ScheduleOut, summary="Resume a paused schedule")
def resume_schedule(request: ApiRequest, name: str, body: StateIn) -> dict[str, Any]:
    """It fires again from its first tick after now."""
    with console_action("schedule", name):
        schedule_resume_act(actor_of(request), name=name, reason=body.reason, expected=body.expected.strip() or None)
    return _out(_get(request, name))


@router.post("/{name}/trigger", response=TickOut, summary="Fire one tick now")
def trigger_schedule(request: ApiRequest, name: str, body: ReasonIn) -> dict[str, Any]:
    """A tick at this instant, whatever the calendar (a paused schedule too); its ``outcome`` says
    whether a run started (the overlap policy may skip or buffer it)."""
    if body.overlap is not None and body.overlap not in OVERLAP_CHOICES:
        raise Problem("validation", f"overlap must be one of {', '.join(OVERLAP_CHOICES)}")
    with console_action("schedule", name):
        tick = schedule_trigger_act(actor_of(request), name=name, reason=body.reason, overlap=body.overlap)
    return _tick(tick)


class RangeQuery(Schema):
    start: IsoDateTime = Field(..., description="ISO 8601; without an offset, UTC")
    end: IsoDateTime


class BackfillItemOut(Schema):
    tick_at: datetime
    business_key: str
    handled: TickOut | None = Field(..., description="the tick as handled already (a backfill leaves it); null: "
                                                     "it fires")


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


@router.get("/{name}/backfill", response=list[BackfillItemOut], summary="Preview a backfill (writes nothing)")
def preview_backfill(request: ApiRequest, name: str, query: Query[RangeQuery]) -> list[dict[str, Any]]:
    _get(request, name)
    try:
        items = backfill_preview(name=name, start=_utc(query.start), end=_utc(query.end))
    except InvalidArgument as exc:
        raise Problem("validation", str(exc)) from None
    return [{"tick_at": i.tick_at, "business_key": i.business_key, "handled": _tick(i.handled) if i.handled else None}
            for i in items]


class BackfillIn(Schema):
    start: IsoDateTime
    end: IsoDateTime
    reason: Text = Field(..., min_length=1, max_length=4000, description="goes into the audit log")
    overlap: str = Field("allow_all", pattern=choice(OVERLAP_CHOICES), description=" / ".join(OVERLAP_CHOICES))


@router.post("/{name}/backfill", response=list[TickOut], summary="Fire the ticks of a range not handled yet")
def backfill(request: ApiRequest, name: str, body: BackfillIn) -> list[dict[str, Any]]:
    """At most 1,000 ticks, oldest first; those already handled are left alone (a second backfill
    of the same range fires nothing)."""
    if body.overlap not in OVERLAP_CHOICES:
        raise Problem("validation", f"overlap must be one of {', '.join(OVERLAP_CHOICES)}")
    with console_action("schedule", name):
        ticks = schedule_backfill_act(actor_of(request), name=name, start=_utc(body.start), end=_utc(body.end),
                                      reason=body.reason, overlap=body.overlap)
    return [_tick(t) for t in ticks]


class Deleted(Schema):
    message: str


@router.post("/{name}/delete", response=Deleted, summary="Delete a schedule (its runs stay)")
def delete_schedule(request: ApiRequest, name: str, body: StateIn) -> dict[str, Any]:
    with console_action("schedule", name):
        schedule_delete_act(actor_of(request), name=name, reason=body.reason, expected=body.expected.strip() or None)
    return {"message": f"schedule {name} deleted; the runs it started stay"}


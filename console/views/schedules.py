"""The schedules pages: every schedule the user may see (its calendar, its next fire times, its
last ticks and their runs' outcomes), and one schedule's page (its ticks, with pause, resume,
trigger now, delete, and backfill a range with a preview of the ticks first).

A schedule belongs to the tenant of the runs it starts: a user limited to some tenants sees those
tenants' schedules, and another's is a 404 (an attempt on it audited, ``operators``). Actions are
POSTs with CSRF through ``operators.services.schedules`` (role, the schedule's row lock, the state
seen, the change and its audit entry in one transaction): 403 denied, 409 refused (stale page,
double submit), 400 a form it cannot take. Answered with a redirect and a message (or the page
with the refusal), with or without JavaScript.

The backfill form is a GET first (``?start=&end=``): the page lists the ticks the range holds and
the business key each run would get, and marks those already handled (left alone); its
"Backfill these ticks" button posts the same range.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.forms import ActionForm
from console.forms_schedules import (
    ScheduleBackfillForm,
    ScheduleCreateForm,
    ScheduleStateForm,
    ScheduleTriggerForm,
    utc_time,
)
from console.templatetags.payloads import payload_text
from console.views.base import ConsoleRequest, action_input, action_view, actor_of, bad_request, viewer_required
from operators import roles
from operators.selectors.tenancy import may_see, tenants_of
from operators.services.actions import Denied, Incomplete, Refused, audit_denied
from operators.services.schedules import (
    schedule_backfill_act,
    schedule_create_act,
    schedule_delete_act,
    schedule_pause_act,
    schedule_resume_act,
    schedule_trigger_act,
)
from operators.services.tenancy import check_tenant
from sagas.errors import InvalidArgument, NotSerializable, WorkflowNotRegistered
from sagas.integration import (
    CATCH_UP_CHOICES,
    DEFAULT_BUSINESS_KEY,
    OVERLAP_CHOICES,
    BackfillItem,
    backfill_preview,
    next_fire_times,
)
from sagas.integration import SCHEDULE_NAME as NAME
from sagas.models import Schedule, ScheduleTick, TickOutcome, WorkflowRun, WorkflowVersion

NEXT_SHOWN = 3  # next fire times per schedule on the list
LAST_SHOWN = 5  # last ticks per schedule on the list
TICKS_SHOWN = 100  # ticks on a schedule's page


@dataclass(frozen=True)
class TickRow:
    tick: ScheduleTick
    run_status: str  # "" for no run; "archived" for a run retention removed


@dataclass(frozen=True)
class ScheduleRow:
    s: Schedule
    next_times: list[tuple[datetime, str]]  # (UTC, local as text) of the next fire times
    last: list[TickRow]


def _visible(user: Any) -> Any:
    schedules = Schedule.objects.order_by("name")
    seen = tenants_of(user)
    return schedules if seen is None else schedules.filter(tenant__in=seen)


def _next_times(schedule: Schedule, count: int) -> list[tuple[datetime, str]]:
    """(UTC, the same time in the schedule's zone as text) of its next fire times. As text: the
    template's ``date`` filter would show it in the console's zone again."""
    zone = ZoneInfo(schedule.timezone)
    return [(t, t.astimezone(zone).strftime("%Y-%m-%d %H:%M %Z")) for t in next_fire_times(schedule, count)]


def _tick_rows(ticks: list[ScheduleTick]) -> list[TickRow]:
    ids = [t.run_id for t in ticks if t.run_id]
    statuses = dict(WorkflowRun.objects.filter(id__in=ids).values_list("id", "status"))
    return [TickRow(t, statuses.get(t.run_id, "archived") if t.run_id else "") for t in ticks]


def _rows(user: Any) -> list[ScheduleRow]:
    rows = []
    for schedule in _visible(user):
        last = list(ScheduleTick.objects.filter(schedule=schedule).order_by("-tick_at")[:LAST_SHOWN])
        rows.append(ScheduleRow(schedule, _next_times(schedule, NEXT_SHOWN), _tick_rows(last)))
    return rows


def _list(request: ConsoleRequest, *, status: int = 200, form: dict[str, str] | None = None) -> HttpResponse:
    return render(request, "console/schedules.html", {
        "rows": _rows(request.user), "may_act": roles.can(request.user, "schedule.pause"),
        "may_create": roles.can(request.user, "schedule.create"), "outcomes": TickOutcome,
        "workflows": sorted(set(WorkflowVersion.objects.values_list("name", flat=True))),
        "form": form or {}, "catch_up_choices": CATCH_UP_CHOICES, "overlap_choices": OVERLAP_CHOICES,
        "default_key": DEFAULT_BUSINESS_KEY,
    }, status=status)


@require_http_methods(["GET", "POST"])
@action_view("schedule.create", "schedule", id_kwarg="name")
def schedules(request: ConsoleRequest) -> HttpResponse:
    """The list; a POST creates a schedule (the operator role, a tenant the user sees; audited)."""
    if request.method != "POST":
        return _list(request)
    sent = {k: str(v)[:200] for k, v in request.POST.items() if k != "csrfmiddlewaretoken"}
    actor = actor_of(request)
    if not roles.can(request.user, "schedule.create"):
        with transaction.atomic():
            audit_denied(actor, "schedule.create", "schedule", sent.get("name", "")[:100],
                         reason=str(request.POST.get("reason", "")))
        raise PermissionDenied(f"{actor.label} may not create a schedule: it needs the operator role")
    fields, problem = action_input(request, ScheduleCreateForm, "schedule.create")
    if problem:
        messages.error(request, problem)
        return _list(request, status=400, form=sent)
    try:
        made = schedule_create_act(actor, spec=fields["spec"], reason=fields["reason"])
    except Denied as exc:
        raise PermissionDenied(str(exc)) from None
    except (InvalidArgument, NotSerializable, WorkflowNotRegistered) as exc:
        messages.error(request, f"{exc}. Nothing was created.")
        return _list(request, status=409 if "already a schedule" in str(exc) else 400, form=sent)
    messages.success(request, f"Schedule {made.name} created: its first tick is "
                              f"{made.next_tick_at:%Y-%m-%d %H:%M:%S} UTC.")
    return redirect(reverse("console:schedule", args=[made.name]))


def _schedule_for_user(request: ConsoleRequest, name: str, *, action: str = "") -> Schedule:
    """The schedule, or 404 for an unknown name and for one outside the user's tenants (an
    action's attempt on that one audited)."""
    schedule = Schedule.objects.filter(name=name).first() if NAME.fullmatch(name) else None
    if schedule is None:
        raise Http404("no such schedule")
    if not may_see(request.user, schedule.tenant):
        if action:
            check_tenant(actor_of(request), action, "schedule", name)
        raise Http404("no such schedule")
    return schedule


def _detail(request: ConsoleRequest, schedule: Schedule, *, status: int = 200,
            preview: list[BackfillItem] | None = None, backfill: dict[str, str] | None = None) -> HttpResponse:
    ticks = list(ScheduleTick.objects.filter(schedule=schedule).order_by("-tick_at")[:TICKS_SHOWN])
    return render(request, "console/schedule_detail.html", {
        "s": schedule, "input_text": payload_text(schedule.input), "next_times": _next_times(schedule, 10),
        "ticks": _tick_rows(ticks),
        "may_act": roles.can(request.user, "schedule.pause"), "preview": preview,
        "backfill": backfill or {}, "preview_new": sum(1 for i in preview or [] if i.handled is None),
    }, status=status)


@require_GET
@viewer_required
def schedule_detail(request: ConsoleRequest, name: str) -> HttpResponse:
    """The schedule's page; with ``?start=&end=`` (UTC), the backfill preview of that range."""
    schedule = _schedule_for_user(request, name)
    start, end = str(request.GET.get("start", ""))[:40], str(request.GET.get("end", ""))[:40]
    if not (start or end):
        return _detail(request, schedule)
    try:
        first, last = utc_time("From", start), utc_time("To", end)
        preview = backfill_preview(name=name, start=first, end=last)
    except (forms.ValidationError, InvalidArgument) as exc:
        text = " ".join(exc.messages) if isinstance(exc, forms.ValidationError) else str(exc)
        return bad_request(request, text, title="Cannot preview this backfill")
    return _detail(request, schedule, preview=preview, backfill={"start": start, "end": end})


def _answer(request: ConsoleRequest, schedule: Schedule, *, status: int = 200, error: str = "",
            notice: str = "") -> HttpResponse:
    if status == 400:
        return bad_request(request, error)
    if status == 403:
        raise PermissionDenied(error)
    if status >= 400:
        messages.error(request, error)
        return _detail(request, schedule, status=status)
    messages.success(request, notice)
    if not Schedule.objects.filter(name=schedule.name).exists():  # deleted
        return redirect(reverse("console:schedules"))
    return redirect(reverse("console:schedule", args=[schedule.name]))


def _act(request: ConsoleRequest, name: str, action: str, form: type[ActionForm],
         act: Callable[[dict[str, Any]], Any], done: Callable[[Any], str]) -> HttpResponse:
    schedule = _schedule_for_user(request, name, action=action)
    fields, problem = action_input(request, form, action)
    if problem:
        return _answer(request, schedule, status=400, error=problem)
    try:
        result = act(fields)
    except (Denied, Incomplete, Refused) as exc:
        status = 403 if isinstance(exc, Denied) else 400 if isinstance(exc, Incomplete) else 409
        if isinstance(exc.__cause__, InvalidArgument):  # a range of over 1,000 ticks
            status = 400
        return _answer(request, schedule, status=status, error=str(exc))
    return _answer(request, schedule, notice=done(result))


@require_POST
@action_view("schedule.pause", "schedule", id_kwarg="name")
def schedule_pause(request: ConsoleRequest, name: str) -> HttpResponse:
    return _act(request, name, "schedule.pause", ScheduleStateForm,
                lambda f: schedule_pause_act(actor_of(request), name=name, reason=f["reason"],
                                             expected=f["expected"] or None),
                lambda _: f"Schedule {name} paused: its ticks are not fired until it is resumed, and those that "
                          f"fall meanwhile are not fired later (a backfill can fire them).")


@require_POST
@action_view("schedule.resume", "schedule", id_kwarg="name")
def schedule_resume(request: ConsoleRequest, name: str) -> HttpResponse:
    return _act(request, name, "schedule.resume", ScheduleStateForm,
                lambda f: schedule_resume_act(actor_of(request), name=name, reason=f["reason"],
                                              expected=f["expected"] or None),
                lambda s: f"Schedule {name} resumed: its next tick is {s.next_tick_at:%Y-%m-%d %H:%M:%S} UTC.")


def _tick_text(tick: ScheduleTick) -> str:
    if tick.outcome == TickOutcome.STARTED:
        return f"run {tick.run_id} started"
    return f"{tick.outcome}" + (f": {tick.note}" if tick.note else "")


@require_POST
@action_view("schedule.trigger", "schedule", id_kwarg="name")
def schedule_trigger(request: ConsoleRequest, name: str) -> HttpResponse:
    return _act(request, name, "schedule.trigger", ScheduleTriggerForm,
                lambda f: schedule_trigger_act(actor_of(request), name=name, reason=f["reason"]),
                lambda tick: f"Schedule {name} fired now: {_tick_text(tick)}.")


@require_POST
@action_view("schedule.delete", "schedule", id_kwarg="name")
def schedule_delete(request: ConsoleRequest, name: str) -> HttpResponse:
    return _act(request, name, "schedule.delete", ScheduleStateForm,
                lambda f: schedule_delete_act(actor_of(request), name=name, reason=f["reason"],
                                              expected=f["expected"] or None),
                lambda _: f"Schedule {name} deleted; the runs it started stay.")


@require_POST
@action_view("schedule.backfill", "schedule", id_kwarg="name")
def schedule_backfill(request: ConsoleRequest, name: str) -> HttpResponse:
    def done(ticks: list[ScheduleTick]) -> str:
        started = sum(1 for t in ticks if t.outcome == TickOutcome.STARTED)
        return (f"Backfilled schedule {name}: {len(ticks)} tick(s) fired, {started} run(s) started"
                + (f", {len(ticks) - started} not started (see the ticks below)" if len(ticks) > started else "")
                + ".")

    return _act(request, name, "schedule.backfill", ScheduleBackfillForm,
                lambda f: schedule_backfill_act(actor_of(request), name=name, start=f["start"], end=f["end"],
                                                reason=f["reason"]),
                done)

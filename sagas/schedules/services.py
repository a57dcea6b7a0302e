"""Writes on schedules: create, change, pause, resume, trigger, backfill, delete, and the sync of
the schedules declared in code. Each runs in one transaction and locks the schedule's row first,
so it queues behind a sweeper firing that schedule instead of racing it.

Who did it is the caller's to audit (``operators.services.schedules`` for the console and the
HTTP API); ticks a person fired carry their name (``ScheduleTick.actor_label``).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from sagas.errors import ActionNotAllowed, InvalidArgument
from sagas.models import Schedule, ScheduleTick, TickOutcome
from sagas.schedules.firing import MAX_BACKFILL, backfill_ticks, db_now, fire_tick, first_tick_after, spec_of
from sagas.schedules.spec import ScheduleSpec, business_key
from sagas.validation import checked_json, required_reason

log = logging.getLogger("sagas.schedules")

SPEC_FIELDS = ("workflow_name", "tenant", "cron", "timezone", "every", "input", "business_key", "jitter",
               "catch_up", "catch_up_window", "overlap")


def _fields(spec: ScheduleSpec) -> dict[str, Any]:
    return {"workflow_name": spec.workflow, "tenant": spec.tenant, "cron": spec.cron, "timezone": spec.timezone,
            "every": spec.every, "input": spec.input, "business_key": spec.business_key, "jitter": spec.jitter,
            "catch_up": spec.catch_up, "catch_up_window": spec.catch_up_window, "overlap": spec.overlap}


def _input_check(spec: ScheduleSpec) -> ScheduleSpec:
    """The spec with its input as PostgreSQL stores it (``NotSerializable`` if it cannot)."""
    return dataclasses.replace(spec, input=checked_json(spec.input, what="schedule input"))


def schedule_lock(*, name: str) -> Schedule:
    """The schedule, its row locked until the transaction ends; ``Schedule.DoesNotExist``."""
    return Schedule.objects.select_for_update().get(name=name)


def schedule_create(*, spec: ScheduleSpec, source: str = "api", now: datetime | None = None) -> Schedule:
    """A new schedule, its first tick the first one after ``now`` (the clock (``firing.db_now``)).
    ``InvalidArgument`` for a malformed spec or a name already taken; ``WorkflowNotRegistered``
    for a workflow this process does not have."""
    from sagas.versions import registry

    spec = _input_check(spec.checked())
    if not spec.workflow:
        raise InvalidArgument(f"schedule {spec.name!r}: name the workflow it starts")
    registry.get(spec.workflow)
    with transaction.atomic():
        at = now or db_now()
        schedule = Schedule(name=spec.name, source=source, **_fields(spec))
        schedule.next_tick_at, schedule.due_at = first_tick_after(schedule, at)
        try:
            with transaction.atomic():
                schedule.save()
        except IntegrityError:
            raise InvalidArgument(f"there is already a schedule named {spec.name!r}") from None
    return schedule


def schedule_update(*, name: str, spec: ScheduleSpec, now: datetime | None = None) -> Schedule:
    """Change a schedule's spec (its name stays). A change to its calendar moves its next tick
    to the first one after ``now``; ticks already handled stay as they were."""
    spec = _input_check(dataclasses.replace(spec, name=name).checked())
    with transaction.atomic():
        schedule = schedule_lock(name=name)
        _apply(schedule, spec, now or db_now())
    return schedule


def _apply(schedule: Schedule, spec: ScheduleSpec, now: datetime) -> bool:
    fields = _fields(spec)
    if all(getattr(schedule, k) == v for k, v in fields.items()):
        return False
    timing = any(getattr(schedule, k) != fields[k] for k in ("cron", "timezone", "every", "jitter"))
    for key, value in fields.items():
        setattr(schedule, key, value)
    if timing:
        schedule.next_tick_at, schedule.due_at = first_tick_after(schedule, now)
    schedule.save()
    return True


def schedule_pause(*, name: str, reason: str, actor: str = "api") -> Schedule:
    """Stop firing until ``schedule_resume``. Ticks that fall during the pause are not fired on
    resume (a backfill of the paused time can fire them). ``ActionNotAllowed`` if it is paused
    already or no reason is given."""
    reason = required_reason(reason, "pause a schedule")
    with transaction.atomic():
        schedule = schedule_lock(name=name)
        if schedule.paused:
            raise ActionNotAllowed(f"schedule {name} is already paused ({schedule.paused_reason})")
        schedule.paused, schedule.paused_reason = True, f"{reason} (by {actor})"
        schedule.save(update_fields=["paused", "paused_reason", "updated_at"])
    return schedule


def schedule_resume(*, name: str, now: datetime | None = None) -> Schedule:
    """Fire again, from the first tick after ``now``. ``ActionNotAllowed`` if it is not paused."""
    with transaction.atomic():
        schedule = schedule_lock(name=name)
        if not schedule.paused:
            raise ActionNotAllowed(f"schedule {name} is not paused")
        schedule.paused, schedule.paused_reason = False, ""
        schedule.next_tick_at, schedule.due_at = first_tick_after(schedule, now or db_now())
        schedule.save(update_fields=["paused", "paused_reason", "next_tick_at", "due_at", "updated_at"])
    return schedule


def _save_firing(schedule: Schedule) -> None:
    Schedule.objects.filter(id=schedule.id).update(last_run_id=schedule.last_run_id,
                                                   buffered_tick_at=schedule.buffered_tick_at)


def schedule_trigger(*, name: str, actor: str = "api", overlap: str | None = None,
                     now: datetime | None = None) -> ScheduleTick:
    """Fire the schedule now, as a tick at this instant, whatever its calendar (a paused schedule
    too), under its overlap policy unless ``overlap`` says otherwise. Returns the tick."""
    if overlap is not None and overlap not in ("skip", "buffer_one", "allow_all", "cancel_previous"):
        raise InvalidArgument("overlap must be one of skip, buffer_one, allow_all, cancel_previous")
    with transaction.atomic():
        schedule = schedule_lock(name=name)
        at = now or db_now()
        fire_tick(schedule, at, how="trigger", now=at, overlap=overlap, actor=actor)
        _save_firing(schedule)
        return ScheduleTick.objects.get(schedule=schedule, tick_at=at)


@dataclass(frozen=True)
class BackfillItem:
    tick_at: datetime
    business_key: str
    handled: ScheduleTick | None  # the tick as already handled (then a backfill leaves it), or None


def backfill_preview(*, name: str, start: datetime, end: datetime) -> list[BackfillItem]:
    """What ``schedule_backfill`` would do with ``[start, end]``: each tick, the business key its
    run would get, and whether it was handled already (those are left as they are; a tick
    recorded ``missed`` is not: a backfill fires it). Writes nothing. ``InvalidArgument`` for more
    than 1,000 ticks or an end before the start."""
    schedule = Schedule.objects.get(name=name)
    ticks = backfill_ticks(schedule, start, end)
    handled = {t.tick_at: t for t in ScheduleTick.objects.filter(schedule=schedule, tick_at__in=ticks)
               .exclude(outcome=TickOutcome.MISSED)}
    spec = spec_of(schedule)
    return [BackfillItem(tick, business_key(spec, tick), handled.get(tick)) for tick in ticks]


def schedule_backfill(*, name: str, start: datetime, end: datetime, actor: str = "api",
                      overlap: str = "allow_all") -> list[ScheduleTick]:
    """Fire each tick of ``[start, end]`` not handled yet (or recorded ``missed``), oldest first,
    under ``overlap`` (default ``allow_all``: the backfilled runs go side by side). Returns the
    ticks handled now."""
    if overlap not in ("skip", "buffer_one", "allow_all", "cancel_previous"):
        raise InvalidArgument("overlap must be one of skip, buffer_one, allow_all, cancel_previous")
    with transaction.atomic():
        schedule = schedule_lock(name=name)
        ticks = backfill_ticks(schedule, start, end)
        at = db_now()
        done = set(ScheduleTick.objects.filter(schedule=schedule, tick_at__in=ticks)
                   .exclude(outcome=TickOutcome.MISSED).values_list("tick_at", flat=True))
        fired = [t for t in ticks if t not in done]
        for tick in fired:
            fire_tick(schedule, tick, how="backfill", now=at, overlap=overlap, actor=actor)
        _save_firing(schedule)
        return list(ScheduleTick.objects.filter(schedule=schedule, tick_at__in=fired).order_by("tick_at"))


def schedule_delete(*, name: str) -> None:
    """Delete a schedule and the record of its ticks; the runs it started stay."""
    with transaction.atomic():
        schedule_lock(name=name).delete()


def schedules_sync(*, declared: list[ScheduleSpec], now: datetime | None = None) -> dict[str, str]:
    """Make the schedules declared in code (``@workflow(schedules=[...])``) exist as declared:
    create the new ones, update those whose spec changed (a paused one stays paused). A name held
    by a schedule created through the API is left alone, and logged. Safe to run from several
    processes at once. Returns what happened to each name."""
    done: dict[str, str] = {}
    for spec in declared:
        try:
            with transaction.atomic():
                existing = Schedule.objects.select_for_update().filter(name=spec.name).first()
                if existing is None:
                    schedule_create(spec=spec, source="code", now=now)
                    done[spec.name] = "created"
                elif existing.source != "code":
                    log.warning("schedule %s is declared in code and was created through the API; the API's is kept",
                                spec.name)
                    done[spec.name] = "kept (created through the API)"
                else:
                    done[spec.name] = "updated" if _apply(existing, _input_check(spec.checked()),
                                                          now or db_now()) else "unchanged"
        except InvalidArgument as exc:  # another process created it first: the next sync compares
            if "already a schedule" not in str(exc):
                raise
            done[spec.name] = "created elsewhere"
    return done


__all__ = ["MAX_BACKFILL"]

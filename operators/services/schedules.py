"""Operator actions on a schedule: create, pause, resume, trigger now, backfill a range, delete
(each through ``actions.perform``: role, tenant, the schedule's row locked, the state the person
saw, the change and its audit entry in one transaction).

A schedule belongs to the tenant of the runs it starts: someone limited to other tenants does not
see it (404, audited). Its state, for the stale-page check, is "active" or "paused"; trigger and
backfill need no state (they fire whatever it is)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from operators import roles
from operators.selectors.tenancy import may_see
from operators.services.actions import Actor, Denied, Target, audit_denied, audit_done, perform
from sagas.integration import SCHEDULE_NAME as NAME
from sagas.integration import (
    ScheduleSpec,
    schedule_backfill,
    schedule_create,
    schedule_delete,
    schedule_lock,
    schedule_pause,
    schedule_resume,
    schedule_trigger,
)
from sagas.models import Schedule


def schedule_snapshot(name: str) -> dict[str, Any]:
    s = Schedule.objects.filter(name=name).first()
    if s is None:
        return {"state": "deleted"}
    return {"state": "paused" if s.paused else "active", "workflow": s.workflow_name, "timing": s.timing,
            "overlap": s.overlap, "catch_up": s.catch_up, "paused_reason": s.paused_reason,
            "next_tick_at": s.next_tick_at.isoformat() if s.next_tick_at else None}


def _target(name: str) -> Target:
    def stale(now: dict[str, Any], seen: str) -> str:
        return (f"Schedule {name} is now {now['state']}; it changed since you loaded the page (you saw it {seen}), "
                f"so nothing was changed.")

    return Target("schedule", name, lock=lambda: schedule_lock(name=name), snapshot=lambda: schedule_snapshot(name),
                  stale=stale)


def _known(name: str) -> None:
    if not NAME.fullmatch(name) or not Schedule.objects.filter(name=name).exists():
        raise Schedule.DoesNotExist(f"no schedule {name[:100]!r}")


def schedule_pause_act(actor: Actor, *, name: str, reason: str, expected: str | None) -> Any:
    _known(name)
    return perform(actor, "schedule.pause", _target(name), reason=reason, expected=expected,
                   change=lambda: schedule_pause(name=name, reason=reason, actor=actor.label))


def schedule_resume_act(actor: Actor, *, name: str, reason: str, expected: str | None) -> Any:
    _known(name)
    return perform(actor, "schedule.resume", _target(name), reason=reason, expected=expected,
                   change=lambda: schedule_resume(name=name))


def schedule_trigger_act(actor: Actor, *, name: str, reason: str, overlap: str | None = None) -> Any:
    _known(name)
    return perform(actor, "schedule.trigger", _target(name), reason=reason, expected=None, require_expected=False,
                   change=lambda: schedule_trigger(name=name, actor=actor.label, overlap=overlap))


def schedule_backfill_act(actor: Actor, *, name: str, start: datetime, end: datetime, reason: str,
                          overlap: str = "allow_all") -> Any:
    _known(name)
    return perform(actor, "schedule.backfill", _target(name), reason=reason, expected=None, require_expected=False,
                   change=lambda: schedule_backfill(name=name, start=start, end=end, actor=actor.label,
                                                    overlap=overlap))


def schedule_delete_act(actor: Actor, *, name: str, reason: str, expected: str | None) -> Any:
    _known(name)
    return perform(actor, "schedule.delete", _target(name), reason=reason, expected=expected,
                   change=lambda: schedule_delete(name=name))


def schedule_create_act(actor: Actor, *, spec: ScheduleSpec, reason: str = "") -> Schedule:
    """Create a schedule (audited). Its tenant must be one the actor sees (``Denied`` otherwise,
    audited); a malformed spec raises ``InvalidArgument`` and writes nothing but the refusal."""
    if not roles.can(actor.user, "schedule.create") or not may_see(actor.user, spec.tenant):
        audit_denied(actor, "schedule.create", "schedule", spec.name, reason=reason, tenant=spec.tenant)
        raise Denied(f"{actor.label} may not create a schedule for tenant {spec.tenant!r}")
    with transaction.atomic():
        made = schedule_create(spec=spec)
        audit_done(actor, "schedule.create", "schedule", made.name, reason=reason, after=schedule_snapshot(made.name),
                   tenant=made.tenant)
    return made

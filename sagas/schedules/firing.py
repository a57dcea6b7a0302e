"""Firing schedules' ticks: from the sweeper's pass, and when a person triggers or backfills.

Each tick is handled once, however many processes fire: a process locks the schedule's row
(``FOR UPDATE SKIP LOCKED``: a second sweeper takes another schedule, never waits), claims the
tick with a unique ``(schedule, tick_at)`` row, starts the run with a business key made from
the tick (so a start is idempotent even if a claim were lost), and moves the schedule's next
tick on, all in one transaction. A crash anywhere in it rolls all of it back, and the next pass
handles the tick as if nothing happened.

Firing needs no worker: the run starts PENDING, and a worker picks it up when there is one.
A process that does not have the workflow registered records the tick ``failed`` (with why)
rather than leave the schedule stuck behind it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from core.storage import is_storage_error
from sagas.errors import ActionNotAllowed, InvalidArgument, RunFinished, SagaError
from sagas.models import TERMINAL_STATUSES, Schedule, ScheduleTick, TickOutcome, WorkflowRun
from sagas.schedules.spec import ScheduleSpec, business_key, jitter_of, ticks_after, ticks_between

log = logging.getLogger("sagas.schedules")

BATCH = 50  # schedules locked and handled per transaction
MAX_TICKS = 10_000  # ticks looked at for one schedule in one pass (a long outage of a 1 s schedule)
MAX_BACKFILL = 1_000


def db_now() -> datetime:
    """The clock ticks are fired by: Django's (``timezone.now``), as timers are woken by, so
    ``sagas.testing.frozen_clock`` moves both. Keep the hosts' clocks in sync (NTP)."""
    return timezone.now()


def spec_of(schedule: Schedule) -> ScheduleSpec:
    return ScheduleSpec(
        name=schedule.name, workflow=schedule.workflow_name, cron=schedule.cron, timezone=schedule.timezone,
        every=schedule.every, input=schedule.input, tenant=schedule.tenant, business_key=schedule.business_key,
        jitter=schedule.jitter, catch_up=schedule.catch_up, catch_up_window=schedule.catch_up_window,
        overlap=schedule.overlap,
    )


def first_tick_after(schedule: Schedule, after: datetime) -> tuple[datetime | None, datetime | None]:
    """(the first tick after ``after``, when it is due), or (None, None) for a cron expression
    with no tick in the next 50 years."""
    spec = spec_of(schedule)
    tick = next(ticks_after(spec, after), None)
    if tick is None:
        return None, None
    return tick, tick + jitter_of(spec.name, tick, spec.jitter)


def next_fire_times(schedule: Schedule, count: int) -> list[datetime]:
    """The schedule's next ``count`` ticks (UTC), from the next one not handled yet; none while
    it is paused (its ticks meanwhile are not fired)."""
    if schedule.paused or schedule.next_tick_at is None:
        return []
    times = [schedule.next_tick_at]
    for tick in ticks_after(spec_of(schedule), schedule.next_tick_at):
        if len(times) >= count:
            break
        times.append(tick)
    return times


@dataclass
class FireReport:
    started: int = 0
    skipped: int = 0
    missed: int = 0
    failed: int = 0

    def add(self, outcome: str) -> None:
        if outcome == TickOutcome.STARTED:
            self.started += 1
        elif outcome == TickOutcome.MISSED:
            self.missed += 1
        elif outcome == TickOutcome.FAILED:
            self.failed += 1
        else:
            self.skipped += 1


def fire_due(*, now: datetime | None = None, budget: float | None = None) -> FireReport:
    """Handle every tick due at ``now`` (default: the clock, read again for each batch), and
    start what a buffered tick was waiting for. Schedules are locked ``BATCH`` at a time
    (``SKIP LOCKED``: a second sweeper takes the next ones) and handled in one transaction, each
    in a savepoint of its own, so one that fails is logged and retried next pass without holding
    the others back. Goes on until nothing is due or ``budget`` seconds have passed (default:
    one sweep interval, at least a second), so 1,000 schedules sharing a tick are fired in one
    pass; what is left is the next pass's (or the other sweepers')."""
    report = FireReport()
    limit = time.monotonic() + (budget if budget is not None else max(1.0, settings.SAGAS_SWEEP_INTERVAL))
    while time.monotonic() < limit:
        with transaction.atomic():
            at = now or db_now()
            batch = list(Schedule.objects.select_for_update(skip_locked=True)
                         .filter(paused=False, due_at__lte=at).order_by("due_at")[:BATCH])
            for schedule in batch:
                _guarded(_handle_due, schedule, at, report)
        if len(batch) < BATCH:
            break
    while time.monotonic() < limit:
        with transaction.atomic():
            at = now or db_now()
            buffered = _next_buffered()
            if buffered is None:
                break
            _guarded(_start_buffered, buffered, at, report)
    return report


def _guarded(handle: Callable[[Schedule, datetime, FireReport], None], schedule: Schedule, at: datetime,
             report: FireReport) -> None:
    """``handle(schedule, at, report)`` in a savepoint: a schedule whose handling fails (not a
    storage error: that ends the pass) is logged and left for the next pass."""
    try:
        with transaction.atomic():
            handle(schedule, at, report)
    except Exception as exc:
        if is_storage_error(exc):
            raise
        log.exception("schedule %s: its due ticks could not be handled; retrying next pass", schedule.name)


def seconds_until_due() -> float | None:
    """How long until the next schedule is due (0 if one is), or None if none is coming: a
    sweeper loop waits no longer than this, so a tick fires on time rather than at its next
    pass."""
    with connection.cursor() as cur:
        cur.execute("SELECT min(due_at) FROM sagas_schedule WHERE NOT paused")
        due = cur.fetchone()[0]
    if due is None:
        return None
    return max(0.0, (due - db_now()).total_seconds())


def _next_buffered() -> Schedule | None:
    """A schedule holding a buffered tick whose previous run has finished (locked), if any."""
    with connection.cursor() as cur:
        cur.execute(
            """SELECT s.id FROM sagas_schedule s
               WHERE s.buffered_tick_at IS NOT NULL AND NOT s.paused
                 AND NOT EXISTS (SELECT 1 FROM sagas_workflowrun r WHERE r.id = s.last_run_id
                                 AND NOT (r.status = ANY(%s)))
               ORDER BY s.buffered_tick_at LIMIT 1 FOR UPDATE OF s SKIP LOCKED""",
            [sorted(TERMINAL_STATUSES)],
        )
        row = cur.fetchone()
    return Schedule.objects.get(id=row[0]) if row else None


def _due_ticks(schedule: Schedule, spec: ScheduleSpec, now: datetime) -> tuple[list[datetime], list[datetime],
                                                                                  datetime | None]:
    """(ticks older than the catch-up window, ticks due within it, the first tick not yet due)."""
    window_start = now - spec.catch_up_window
    too_old: list[datetime] = []
    due: list[datetime] = []
    assert schedule.next_tick_at is not None

    def stream() -> Iterator[datetime]:
        yield schedule.next_tick_at  # type: ignore[misc]
        yield from ticks_after(spec, schedule.next_tick_at)  # type: ignore[arg-type]

    for tick in stream():
        if tick + jitter_of(spec.name, tick, spec.jitter) > now:
            return too_old, due, tick
        if len(too_old) + len(due) >= MAX_TICKS:
            return too_old, due, tick  # the rest next pass
        (too_old if tick < window_start else due).append(tick)
    return too_old, due, None


def _handle_due(schedule: Schedule, now: datetime, report: FireReport) -> None:
    spec = spec_of(schedule)
    grace = timedelta(seconds=settings.SAGAS_SCHEDULE_GRACE)
    too_old, due, next_tick = _due_ticks(schedule, spec, now)
    if too_old:
        first, last = too_old[0], too_old[-1]
        note = (f"{len(too_old)} tick(s) from {first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC were "
                f"missed, older than the catch-up window ({spec.catch_up_window})")
        if _claim(schedule, last, TickOutcome.MISSED, "catch_up", now, note=note):
            report.add(TickOutcome.MISSED)
    on_time = [t for t in due if now - (t + jitter_of(spec.name, t, spec.jitter)) <= grace]
    late = set(due) - set(on_time)
    if spec.catch_up == "all":
        fire = set(due)
    elif spec.catch_up == "last":
        fire = set(due[-1:])
    else:
        fire = set(on_time)
    for tick in due:
        if tick in fire:
            how = "catch_up" if tick in late else "schedule"
            report.add(fire_tick(schedule, tick, how=how, now=now))
        else:
            note = f"missed: found {now - tick} after its tick; catch-up mode {spec.catch_up!r}"
            if _claim(schedule, tick, TickOutcome.MISSED, "catch_up", now, note=note):
                report.add(TickOutcome.MISSED)
    schedule.next_tick_at = next_tick
    schedule.due_at = next_tick + jitter_of(spec.name, next_tick, spec.jitter) if next_tick else None
    Schedule.objects.filter(id=schedule.id).update(
        next_tick_at=schedule.next_tick_at, due_at=schedule.due_at, buffered_tick_at=schedule.buffered_tick_at,
        last_run_id=schedule.last_run_id,
    )


def _claim(schedule: Schedule, tick: datetime, outcome: str, how: str, now: datetime, *, note: str = "",
           run_id: Any = None, actor: str = "") -> int | None:
    """Record ``tick`` as handled; None if it already was (by a trigger, a backfill, a race). A
    backfill may take a tick recorded ``missed`` (nothing ran for it): that is what it is for."""
    reclaim = how == "backfill"
    with connection.cursor() as cur:
        cur.execute(
            f"""INSERT INTO sagas_scheduletick (schedule_id, tick_at, outcome, how, run_id, note, handled_at,
                                                actor_label)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (schedule_id, tick_at) DO {
                    "UPDATE SET outcome = EXCLUDED.outcome, how = EXCLUDED.how, run_id = EXCLUDED.run_id, "
                    "note = EXCLUDED.note, handled_at = EXCLUDED.handled_at, actor_label = EXCLUDED.actor_label "
                    "WHERE sagas_scheduletick.outcome = 'missed'" if reclaim else "NOTHING"}
                RETURNING id""",
            [schedule.id, tick, outcome, how, run_id, note, now, actor],
        )
        row = cur.fetchone()
    return row[0] if row else None


def _running(schedule: Schedule) -> str | None:
    """The previous tick's run if it is still going."""
    if schedule.last_run_id is None:
        return None
    status = WorkflowRun.objects.filter(id=schedule.last_run_id).values_list("status", flat=True).first()
    return str(schedule.last_run_id) if status is not None and status not in TERMINAL_STATUSES else None


def fire_tick(schedule: Schedule, tick: datetime, *, how: str, now: datetime, overlap: str | None = None,
              actor: str = "") -> str:
    """Handle one tick of a locked schedule (in the caller's transaction): claim it, apply the
    overlap policy and start its run. The schedule's ``last_run_id`` and ``buffered_tick_at``
    change on the instance; the caller saves them. Returns the tick's outcome (``skipped`` too
    when it had already been handled)."""
    policy = overlap or schedule.overlap
    tick_id = _claim(schedule, tick, TickOutcome.STARTED, how, now, actor=actor)
    if tick_id is None:
        return TickOutcome.SKIPPED
    previous = _running(schedule) if policy != "allow_all" else None
    if previous is not None and policy == "skip":
        return _settle(tick_id, TickOutcome.SKIPPED, note=f"the previous run {previous} was still going")
    if previous is not None and policy == "buffer_one":
        if schedule.buffered_tick_at is not None:
            return _settle(tick_id, TickOutcome.SKIPPED,
                           note=f"the previous run {previous} was still going and a tick was already buffered")
        schedule.buffered_tick_at = tick
        return _settle(tick_id, TickOutcome.BUFFERED, note=f"starts when the previous run {previous} finishes")
    note = ""
    if previous is not None and policy == "cancel_previous":
        note = _cancel_previous(schedule, previous, tick)
    return _start(schedule, tick, tick_id, note=note)


def _cancel_previous(schedule: Schedule, previous: str, tick: datetime) -> str:
    from sagas.services import run_cancel

    try:
        with transaction.atomic():
            run_cancel(run_id=previous, user=None, compensate=False,
                       reason=f"schedule {schedule.name}: the tick at {tick:%Y-%m-%d %H:%M:%S} UTC replaces it")
    except (RunFinished, ActionNotAllowed) as exc:  # it finished meanwhile, or is compensating
        return f"the previous run {previous} was not cancelled: {exc}"
    return f"cancelled the previous run {previous}"


def _start(schedule: Schedule, tick: datetime, tick_id: int, *, note: str = "") -> str:
    from sagas.services import run_start

    spec = spec_of(schedule)
    try:  # what run_start refuses, it refuses before writing (no savepoint needed: _guarded has one)
        run = run_start(name=schedule.workflow_name, input=schedule.input, tenant=schedule.tenant,
                        business_key=business_key(spec, tick), started_via="schedule")
    except (SagaError, InvalidArgument) as exc:
        log.warning("schedule %s: the tick at %s did not start: %s", schedule.name, tick, exc)
        return _settle(tick_id, TickOutcome.FAILED, note=f"not started: {exc}")
    schedule.last_run_id = run.id
    if not getattr(run, "created_now", True):  # a coarse key template: another tick's run has this key
        return _settle(tick_id, TickOutcome.SKIPPED, note=f"run {run.id} already has the business key "
                                                          f"{run.business_key!r}; nothing was started", run_id=run.id)
    ScheduleTick.objects.filter(id=tick_id).update(run_id=run.id, note=note)
    return TickOutcome.STARTED


def _settle(tick_id: int, outcome: str, *, note: str, run_id: Any = None) -> str:
    ScheduleTick.objects.filter(id=tick_id).update(outcome=outcome, note=note, run_id=run_id)
    return outcome


def _start_buffered(schedule: Schedule, now: datetime, report: FireReport) -> None:
    tick = schedule.buffered_tick_at
    assert tick is not None
    schedule.buffered_tick_at = None
    row = ScheduleTick.objects.filter(schedule=schedule, tick_at=tick).first()
    if row is not None and row.outcome == TickOutcome.BUFFERED:
        ScheduleTick.objects.filter(id=row.id).update(outcome=TickOutcome.STARTED, handled_at=now)
        report.add(_start(schedule, tick, row.id, note="buffered until the previous run finished"))
    Schedule.objects.filter(id=schedule.id).update(buffered_tick_at=None, last_run_id=schedule.last_run_id)


def backfill_ticks(schedule: Schedule, start: datetime, end: datetime) -> list[datetime]:
    """The ticks of ``[start, end]`` (at most 1,000; ``InvalidArgument`` beyond)."""
    if end < start:
        raise InvalidArgument("a backfill ends after it starts")
    ticks = ticks_between(spec_of(schedule), start, end, limit=MAX_BACKFILL + 1)
    if len(ticks) > MAX_BACKFILL:
        raise InvalidArgument(f"a backfill covers at most {MAX_BACKFILL} ticks; this range has more")
    return ticks

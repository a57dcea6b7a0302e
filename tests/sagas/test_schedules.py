"""Schedules: each tick fires once however many sweepers race for it; missed ticks after an
outage fire as the schedule's catch-up mode says; a tick that comes while the previous run is
still going follows the overlap policy; cron schedules keep to local time across
daylight-saving changes (Europe/Berlin, America/New_York), as Debian's cron does.

The clock is ``sagas.testing.frozen_clock`` (Django's clock in this process, the one the sweeper
fires ticks by), and a pass is ``sweep_once()``: the sweeper's real pass."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta
from signal import SIGTERM

import pytest
from django.db import connection

from sagas import (
    InvalidArgument,
    backfill_preview,
    backfill_schedule,
    create_schedule,
    pause_schedule,
    resume_schedule,
    schedule,
    schedule_ticks,
    signal,
    trigger_schedule,
)
from sagas.models import RunStatus, Schedule, ScheduleTick, TickOutcome, WorkflowRun
from sagas.schedules import firing
from sagas.schedules.services import schedules_sync
from sagas.testing import frozen_clock, sweep_once
from sagas.versions import registry
from tests.procs import wait_until, worker_env
from tests.sagas import wf_schedules  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_schedules"
T0 = datetime(2030, 1, 7, 9, 0, tzinfo=UTC)  # a Monday, in the future: no real tick interferes


def _create(name: str, workflow: str = "sched_quick", *, at: datetime = T0, **options) -> Schedule:
    """A schedule made at ``at``; its runs overlap unless ``overlap`` says otherwise (no worker runs
    them in most of these tests: they stay PENDING)."""
    options.setdefault("overlap", "allow_all")
    spec = schedule(name, **options)
    with frozen_clock(at):
        return create_schedule(workflow, spec)


def _pass(at: datetime):
    with frozen_clock(at):
        return sweep_once()


def _ticks(name: str) -> list[tuple[datetime, str, str]]:
    return [(t.tick_at, t.outcome, t.how) for t in
            ScheduleTick.objects.filter(schedule__name=name).order_by("tick_at")]


def _runs(name: str) -> list[WorkflowRun]:
    ids = ScheduleTick.objects.filter(schedule__name=name, run_id__isnull=False).values_list("run_id", flat=True)
    return list(WorkflowRun.objects.filter(id__in=ids).order_by("created_at"))


def test_it_fires_each_tick_once_while_two_sweeper_processes_race(procs):
    """Two real ``sagas_sweep`` loops, 50 ms apart, on a schedule ticking every second: every
    tick has one record and one run, and no tick between the first and the last is left out."""
    spec = schedule("race", every=timedelta(seconds=1), catch_up="all", overlap="allow_all")
    create_schedule("sched_quick", spec)
    sweepers = [procs.start(f"sweeper{i}", ["manage.py", "sagas_sweep", "--loop", "--interval", "0.05"],
                            worker_env(MODULES)) for i in (1, 2)]
    wait_until(lambda: ScheduleTick.objects.filter(schedule__name="race").count() >= 8, 40,
               what="eight ticks to fire")
    for sweeper in sweepers:  # a clean stop: each prints every pass that fired before it exits
        assert sweeper.alive()
        sweeper.popen.send_signal(SIGTERM)
    for sweeper in sweepers:
        assert sweeper.popen.wait(timeout=20) == 0
    ticks = _ticks("race")
    assert [o for _, o, _ in ticks] == [TickOutcome.STARTED] * len(ticks)
    assert [b - a for (a, _, _), (b, _, _) in zip(ticks, ticks[1:])] == [timedelta(seconds=1)] * (len(ticks) - 1)
    runs = _runs("race")
    assert len(runs) == len(ticks)  # one run per tick, none twice
    assert WorkflowRun.objects.filter(workflow_name="sched_quick").count() == len(ticks)
    assert {r.business_key for r in runs} == {f"race@{t.isoformat()}" for t, _, _ in ticks}
    assert all(r.started_via == "schedule" for r in runs)
    # What each sweeper says it started adds up to the ticks: no tick was started by both.
    fired = [sum(int(n) for n in re.findall(r"scheduled=(\d+)", s.log())) for s in sweepers]
    assert sum(fired) == len(ticks), procs.logs()


def test_it_fires_each_tick_once_when_eight_passes_run_at_the_same_instant():
    """Eight threads (eight connections) fire the same 30 due ticks at once: each once."""
    _create("crowd", every=timedelta(minutes=1), catch_up="all", overlap="allow_all")
    at = T0 + timedelta(minutes=30, seconds=5)
    barrier = threading.Barrier(8)
    started: list[int] = []

    def fire() -> None:
        try:
            barrier.wait()
            started.append(firing.fire_due(now=at).started)
        finally:
            connection.close()

    threads = [threading.Thread(target=fire) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(started) == 30
    assert [o for _, o, _ in _ticks("crowd")] == [TickOutcome.STARTED] * 30
    assert WorkflowRun.objects.filter(workflow_name="sched_quick").count() == 30


@pytest.mark.parametrize(("mode", "started", "missed"), [
    ("all", 10, 0),  # every missed tick fires, oldest first
    ("last", 1, 9),  # only the newest
    ("none", 0, 10),  # none; the schedule goes on from the next tick
])
def test_it_catches_up_after_a_ten_minute_outage_as_its_mode_says(mode, started, missed, settings):
    settings.SAGAS_SCHEDULE_GRACE = 30  # a tick found more than 30 s after it was missed
    _create("catchup", every=timedelta(minutes=1), catch_up=mode)
    assert _pass(T0 + timedelta(minutes=1, seconds=1)).scheduled == 1  # on time
    # No sweeper for ten minutes: ticks 2..11 pass unfired; the pass after comes 45 s after tick 11.
    report = _pass(T0 + timedelta(minutes=11, seconds=45))
    assert report.scheduled == started
    during = [(o, h) for t, o, h in _ticks("catchup") if T0 + timedelta(minutes=2) <= t <= T0 + timedelta(minutes=11)]
    assert len(during) == 10
    assert sum(o == TickOutcome.STARTED for o, _ in during) == started
    assert sum(o == TickOutcome.MISSED for o, _ in during) == missed
    assert all(h == "catch_up" for _, h in during)  # all were late
    if mode == "last":
        assert _ticks("catchup")[-1][:2] == (T0 + timedelta(minutes=11), TickOutcome.STARTED)
    # Back to normal: the next tick fires on time, whatever the mode.
    assert _pass(T0 + timedelta(minutes=12, seconds=2)).scheduled == 1
    assert _ticks("catchup")[-1] == (T0 + timedelta(minutes=12), TickOutcome.STARTED, "schedule")
    assert WorkflowRun.objects.filter(workflow_name="sched_quick").count() == 2 + started
    # The missed ticks are not lost for good: a backfill of the outage fires them, and only them.
    fired = backfill_schedule("catchup", start=T0 + timedelta(minutes=2), end=T0 + timedelta(minutes=11))
    assert len(fired) == missed and all(t.outcome == TickOutcome.STARTED for t in fired)
    assert WorkflowRun.objects.filter(workflow_name="sched_quick").count() == 12


def test_it_records_ticks_older_than_the_catch_up_window_as_missed_without_firing_them():
    _create("window", every=timedelta(minutes=1), catch_up="all", catch_up_window=timedelta(minutes=5))
    report = _pass(T0 + timedelta(minutes=20, seconds=30))
    assert report.scheduled == 5  # minutes 16..20: within five minutes of the pass
    ticks = _ticks("window")
    assert ticks[0][1] == TickOutcome.MISSED  # one record for the 15 older ticks
    old = ScheduleTick.objects.get(schedule__name="window", outcome=TickOutcome.MISSED)
    assert old.tick_at == T0 + timedelta(minutes=15) and "15 tick(s)" in old.note
    assert [t for t, o, _ in ticks if o == TickOutcome.STARTED] == [T0 + timedelta(minutes=m) for m in range(16, 21)]


@pytest.mark.parametrize("policy", ["skip", "buffer_one", "allow_all", "cancel_previous"])
def test_it_applies_the_overlap_policy_when_the_previous_run_is_still_going(policy, procs, step_calls):
    _create("overlap", "sched_hold", every=timedelta(minutes=1), overlap=policy)
    _pass(T0 + timedelta(minutes=1, seconds=1))
    first = _runs("overlap")[0]
    procs.worker("w1", MODULES)
    wait_until(lambda: WorkflowRun.objects.get(id=first.id).status == RunStatus.WAITING, 60,
               what="the first run to wait for its signal")

    _pass(T0 + timedelta(minutes=2, seconds=1))  # the previous run is still going
    second = ScheduleTick.objects.get(schedule__name="overlap", tick_at=T0 + timedelta(minutes=2))
    runs = _runs("overlap")
    if policy == "skip":
        assert second.outcome == TickOutcome.SKIPPED and str(first.id) in second.note
        assert len(runs) == 1
    elif policy == "allow_all":
        assert second.outcome == TickOutcome.STARTED and len(runs) == 2
    elif policy == "cancel_previous":
        assert second.outcome == TickOutcome.STARTED and len(runs) == 2
        assert WorkflowRun.objects.get(id=first.id).status == RunStatus.CANCELLED
        assert f"cancelled the previous run {first.id}" in second.note
    else:
        assert second.outcome == TickOutcome.BUFFERED and len(runs) == 1
        _pass(T0 + timedelta(minutes=3, seconds=1))  # a second tick while one is buffered: skipped
        third = ScheduleTick.objects.get(schedule__name="overlap", tick_at=T0 + timedelta(minutes=3))
        assert third.outcome == TickOutcome.SKIPPED and "already buffered" in third.note
        signal(run_id=first.id, name="go")
        wait_until(lambda: WorkflowRun.objects.get(id=first.id).status == RunStatus.COMPLETED, 60,
                   what="the first run to complete")
        # No tick is due: the buffered one starts, at this pass or at the worker's own sweep,
        # whichever locks the schedule first (the other skips it).
        _pass(T0 + timedelta(minutes=3, seconds=20))
        wait_until(lambda: ScheduleTick.objects.get(id=second.id).outcome == TickOutcome.STARTED, 10,
                   what="the buffered tick to start")
        second.refresh_from_db()
        assert second.run_id is not None
        runs = _runs("overlap")
        assert [r.business_key for r in runs] == [f"overlap@{(T0 + timedelta(minutes=m)).isoformat()}"
                                                 for m in (1, 2)]
        wait_until(lambda: WorkflowRun.objects.get(id=second.run_id).status == RunStatus.WAITING, 60,
                   what="the buffered tick's run to be taken by the worker")


# The ticks of a schedule across one night, walking the clock from due tick to due tick.
def _night(name: str, cron: str, zone: str, start: datetime, end: datetime) -> list[str]:
    _create(name, cron=cron, timezone=zone, at=start, catch_up="none")
    while True:
        due = Schedule.objects.get(name=name).due_at
        if due > end:
            break
        _pass(due + timedelta(seconds=1))
    return [t.isoformat() for t, o, _ in _ticks(name) if o == TickOutcome.STARTED]


def test_it_keeps_cron_ticks_to_local_time_across_daylight_saving_in_berlin():
    # 29 March 2026: 02:00 CET -> 03:00 CEST. 02:30 does not exist: it fires once, at 03:00 CEST.
    spring = (datetime(2026, 3, 28, 12, tzinfo=UTC), datetime(2026, 3, 30, 12, tzinfo=UTC))
    assert _night("ber-spring", "30 2 * * *", "Europe/Berlin", *spring) == [
        "2026-03-29T01:00:00+00:00", "2026-03-30T00:30:00+00:00"]
    # 25 October 2026: 03:00 CEST -> 02:00 CET. 02:30 happens twice: it fires once, the first time.
    autumn = (datetime(2026, 10, 24, 12, tzinfo=UTC), datetime(2026, 10, 26, 12, tzinfo=UTC))
    assert _night("ber-autumn", "30 2 * * *", "Europe/Berlin", *autumn) == [
        "2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"]
    # Every hour on the hour: the skipped hour has no tick; the repeated hour has two, an hour apart.
    hourly = _night("ber-hourly", "0 * * * *", "Europe/Berlin", datetime(2026, 10, 24, 23, tzinfo=UTC),
                    datetime(2026, 10, 25, 3, tzinfo=UTC))
    assert hourly == [f"2026-10-25T0{h}:00:00+00:00" for h in range(0, 4)]  # 02:00 CEST and 02:00 CET are 00Z, 01Z
    skipped = _night("ber-hourly-spring", "0 * * * *", "Europe/Berlin", datetime(2026, 3, 28, 23, tzinfo=UTC),
                     datetime(2026, 3, 29, 3, tzinfo=UTC))
    assert skipped == [f"2026-03-29T0{h}:00:00+00:00" for h in range(0, 4)]  # 01:00 CET, 03:00, 04:00, 05:00 CEST


def test_it_keeps_cron_ticks_to_local_time_across_daylight_saving_in_new_york():
    # 8 March 2026: 02:00 EST -> 03:00 EDT; 02:30 fires once, at 03:00 EDT (07:00Z).
    spring = (datetime(2026, 3, 7, 12, tzinfo=UTC), datetime(2026, 3, 9, 12, tzinfo=UTC))
    assert _night("ny-spring", "30 2 * * *", "America/New_York", *spring) == [
        "2026-03-08T07:00:00+00:00", "2026-03-09T06:30:00+00:00"]
    # 1 November 2026: 02:00 EDT -> 01:00 EST; 01:30 happens twice and fires once, the first time.
    autumn = (datetime(2026, 10, 31, 12, tzinfo=UTC), datetime(2026, 11, 2, 12, tzinfo=UTC))
    assert _night("ny-autumn", "30 1 * * *", "America/New_York", *autumn) == [
        "2026-11-01T05:30:00+00:00", "2026-11-02T06:30:00+00:00"]


def test_it_triggers_backfills_pauses_and_resumes_a_schedule():
    _create("ops", every=timedelta(hours=1))
    # Trigger now: a tick at this instant, whatever the calendar.
    with frozen_clock(T0 + timedelta(minutes=10)):
        tick = trigger_schedule("ops")
    assert (tick.tick_at, tick.outcome, tick.how) == (T0 + timedelta(minutes=10), TickOutcome.STARTED, "trigger")
    # Backfill: the preview says what would happen; handled ticks are left alone.
    start, end = T0 - timedelta(hours=3), T0
    _pass(T0 + timedelta(hours=1, seconds=1))
    preview = backfill_preview("ops", start=start, end=end + timedelta(hours=1))
    assert [(i.tick_at, i.handled is not None) for i in preview] == [
        (T0 - timedelta(hours=3), False), (T0 - timedelta(hours=2), False), (T0 - timedelta(hours=1), False),
        (T0, False), (T0 + timedelta(hours=1), True)]
    assert preview[0].business_key == f"ops@{(T0 - timedelta(hours=3)).isoformat()}"
    fired = backfill_schedule("ops", start=start, end=end + timedelta(hours=1))
    assert [(t.tick_at, t.outcome, t.how) for t in fired] == [
        (T0 - timedelta(hours=h), TickOutcome.STARTED, "backfill") for h in (3, 2, 1, 0)]
    assert backfill_schedule("ops", start=start, end=end) == []  # a second backfill fires nothing
    assert WorkflowRun.objects.filter(workflow_name="sched_quick").count() == 6
    # Paused: its ticks pass unfired, and stay unfired after the resume.
    pause_schedule("ops", reason="month-end freeze")
    assert _pass(T0 + timedelta(hours=3, seconds=1)).scheduled == 0
    with frozen_clock(T0 + timedelta(hours=3, minutes=30)):
        resumed = resume_schedule("ops")
    assert resumed.next_tick_at == T0 + timedelta(hours=4)
    assert _pass(T0 + timedelta(hours=4, seconds=1)).scheduled == 1
    assert [t.tick_at for t in schedule_ticks("ops", limit=2)] == [T0 + timedelta(hours=4), T0 + timedelta(hours=1)]


def test_it_syncs_the_schedules_declared_in_code_once_however_often_it_runs():
    declared = registry.declared_schedules()
    assert [s.name for s in declared if s.workflow == "sched_declared"] == ["declared-nightly"]
    with frozen_clock(T0):
        assert schedules_sync(declared=declared)["declared-nightly"] == "created"
        assert schedules_sync(declared=declared)["declared-nightly"] == "unchanged"
    made = Schedule.objects.get(name="declared-nightly")
    assert (made.source, made.cron, made.timezone, made.input) == ("code", "0 2 * * *", "Europe/Berlin",
                                                                   {"report": "settlement"})
    assert made.next_tick_at == datetime(2030, 1, 8, 1, 0, tzinfo=UTC)  # 02:00 in Berlin, winter time
    _pass(datetime(2030, 1, 8, 1, 0, 2, tzinfo=UTC))
    run = _runs("declared-nightly")[0]
    assert run.business_key == "settlement-2030-01-08" and run.input == {"report": "settlement"}


def test_it_refuses_a_malformed_schedule_and_writes_nothing():
    for options, message in [
        ({"cron": "61 * * * *"}, "Bad minute"),
        ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": timedelta(minutes=5), "business_key": "daily-{fire_time:%Y-%m-%d}"}, "the same key"),
        ({"every": timedelta(minutes=5), "business_key": "{tenant}-{fire_time}"}, "names tenant"),
        ({"cron": "0 2 * * *", "every": timedelta(minutes=5)}, "exactly one of cron and every"),
        ({"every": timedelta(minutes=5), "overlap": "queue"}, "overlap must be one of"),
        ({"every": timedelta(minutes=5), "catch_up": "some"}, "catch_up must be one of"),
        ({"every": timedelta(minutes=5), "jitter": timedelta(hours=2)}, "jitter"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            schedule("bad", **options)
    _create("taken", every=timedelta(minutes=5))
    with pytest.raises(InvalidArgument, match="already a schedule named 'taken'"):
        _create("taken", every=timedelta(minutes=10))
    with pytest.raises(Schedule.DoesNotExist):
        trigger_schedule("nobody")
    assert list(Schedule.objects.values_list("name", "every")) == [("taken", timedelta(minutes=5))]


def test_it_delays_each_tick_by_its_jitter_the_same_in_every_process():
    made = _create("spread", every=timedelta(minutes=1), jitter=timedelta(seconds=30))
    delay = made.due_at - made.next_tick_at
    assert delay == firing.jitter_of("spread", made.next_tick_at, timedelta(seconds=30))  # from name and tick
    assert timedelta(seconds=1) < delay <= timedelta(seconds=30)
    assert _pass(made.next_tick_at + delay / 2).scheduled == 0  # ticked, not yet due
    assert _pass(made.due_at + timedelta(milliseconds=100)).scheduled == 1
    delays = [firing.jitter_of("spread", T0 + timedelta(minutes=m), timedelta(seconds=30)) for m in range(200)]
    assert len(set(delays)) > 150 and max(delays) <= timedelta(seconds=30)  # spread over the 30 s


def test_it_records_a_tick_whose_key_another_run_already_has_as_skipped_not_as_started():
    """A day-granular key: a trigger on the day of a scheduled tick finds that tick's run."""
    _create("daily", every=timedelta(hours=1), business_key="daily-{fire_time:%Y-%m-%d-%H}")
    _pass(T0 + timedelta(hours=1, seconds=1))
    with frozen_clock(T0 + timedelta(hours=1, minutes=5)):
        tick = trigger_schedule("daily")
    [run] = _runs("daily")
    assert tick.outcome == TickOutcome.SKIPPED and tick.run_id == run.id
    assert "already has the business key 'daily-2030-01-07-10'" in tick.note
    assert WorkflowRun.objects.filter(workflow_name="sched_quick").count() == 1

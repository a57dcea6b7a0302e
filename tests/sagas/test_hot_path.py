"""The dispatch path: start() in one statement, one Redis round trip to wake a worker, a
first claim without a journal load, and an ``advance`` job without RQ's per-job
bookkeeping; each keeping what a user or operator sees."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.test import override_settings
from rq.job import Job

from sagas import signal, start
from sagas.errors import StartConflict
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.replay.engine import Outcome, advance
from sagas.runtime.queue import (
    compensation_queue_name,
    enqueue_advance,
    get_queue,
    marker_key,
    queue_name_for,
    redis_connection,
)
from sagas.runtime.rqworker import SagaWorker
from sagas.store import systemdb
from sagas.versions.registry import workflow
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def _one() -> int:
    return 1


@workflow("hot_two_steps", version=1, max_steps=50, max_cost=2.5, max_duration=timedelta(hours=1))
def hot_two_steps(ctx, spec):
    return ctx.step("a", _one) + ctx.step("b", _one)


@workflow("hot_waits_for_go", version=1)
def hot_waits_for_go(ctx, spec):
    go = ctx.wait_for("go", timedelta(hours=1))
    return {"go": go, "then": ctx.step("after", _one)}


def _journal(run_id) -> list[tuple[int, str, str]]:
    return list(JournalEntry.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "kind", "name"))


@override_settings(SAGAS_DISPATCH_RQ_DELAY=0.05)  # the product's default
def test_it_starts_a_run_with_its_started_entry_budgets_and_starter(django_user_model):
    ann = django_user_model.objects.create_user("ann", password="pw-ann-long-enough")
    run = start("hot_two_steps", {"order": 7, "note": "é"}, business_key="order-7", tenant="acme",
                started_by=ann, started_via="console", max_steps=9)

    stored = WorkflowRun.objects.get(id=run.id)
    for field in ("workflow_name", "version", "definition_hash", "input", "business_key", "tenant", "status",
                  "last_seq", "max_steps", "max_cost", "max_duration", "started_by_id", "started_via", "created_at",
                  "steps_used", "fence", "attempts", "status_reason", "lease_owner"):
        assert getattr(run, field) == getattr(stored, field), field  # what start() returned is what was stored
    assert (stored.status, stored.last_seq, stored.max_steps) == (RunStatus.PENDING, 1, 9)
    assert (stored.max_cost, stored.max_duration) == (Decimal("2.5"), timedelta(hours=1))  # the workflow's
    assert run.created_now is True
    started = JournalEntry.objects.get(run_id=run.id)
    assert (started.seq, started.kind) == (1, "started")
    assert started.payload == {
        "input": {"order": 7, "note": "é"}, "version": 1, "definition_hash": stored.definition_hash,
        "business_key": "order-7", "tenant": "acme", "started_by": "ann", "started_via": "console",
    }
    assert started.created_at == stored.created_at
    # The wake-up goes out a moment after the commit (SAGAS_DISPATCH_RQ_DELAY: workers listening
    # take a new run from PostgreSQL's announcement first): the job on the version's queue and its marker.
    wait_until(lambda: get_queue(queue_name_for(stored.definition_hash)).count == 1, timeout=5,
               what="the run's RQ wake-up")
    assert redis_connection().exists(marker_key(str(run.id)))


@override_settings(SAGAS_DISPATCH_RQ_DELAY=0)
def test_without_the_delay_the_wake_up_goes_out_in_the_same_call():
    run = start("hot_two_steps", {"order": 8})
    assert get_queue(queue_name_for(run.definition_hash)).count == 1
    assert redis_connection().exists(marker_key(str(run.id)))


def test_it_answers_a_repeated_business_key_with_the_first_run_and_refuses_another_input():
    first = start("hot_two_steps", {"order": 1}, business_key="k-1")
    again = start("hot_two_steps", {"order": 1}, business_key="k-1")
    assert again.id == first.id and again.created_now is False

    with pytest.raises(StartConflict, match="different input"):
        start("hot_two_steps", {"order": 2}, business_key="k-1")
    assert WorkflowRun.objects.filter(business_key="k-1").count() == 1
    assert _journal(first.id) == [(1, "started", "")]
    # Another tenant, or no key at all, is another run.
    assert start("hot_two_steps", {"order": 1}, business_key="k-1", tenant="other").id != first.id
    assert start("hot_two_steps", {"order": 1}).id != start("hot_two_steps", {"order": 1}).id


def test_it_writes_and_wakes_nothing_when_the_callers_transaction_rolls_back():
    with pytest.raises(RuntimeError), transaction.atomic():
        run = start("hot_two_steps", {"order": 3}, business_key="rolled-back")
        assert WorkflowRun.objects.filter(id=run.id).exists()  # visible inside the transaction
        raise RuntimeError("the caller changed its mind")
    assert not WorkflowRun.objects.filter(business_key="rolled-back").exists()
    assert not JournalEntry.objects.filter(run_id=run.id).exists()
    time.sleep(0.2)  # past SAGAS_DISPATCH_RQ_DELAY: a wake-up would have gone out by now
    assert not redis_connection().exists(marker_key(str(run.id)))
    assert get_queue(queue_name_for(run.definition_hash)).count == 0
    # The key is free again.
    assert start("hot_two_steps", {"order": 3}, business_key="rolled-back").created_now is True


@pytest.fixture
def journal_loads(monkeypatch):
    """The run ids whose journal the engine read, in order."""
    loads: list[str] = []
    real = systemdb.load_journal

    def counting(run_id: str):  # type: ignore[no-untyped-def]
        loads.append(str(run_id))
        return real(run_id)

    monkeypatch.setattr(systemdb, "load_journal", counting)
    return loads


def test_a_first_claim_runs_without_reading_the_journal(journal_loads):
    run = start("hot_two_steps", {})
    assert advance(str(run.id), owner="t") == Outcome.COMPLETED
    assert journal_loads == []
    assert WorkflowRun.objects.get(id=run.id).result == 2
    assert _journal(run.id) == [(1, "started", ""), (2, "claimed", ""), (3, "step", "a"), (4, "step", "b"),
                                (5, "completed", "")]


def test_a_signal_sent_before_the_first_claim_is_seen_by_it(journal_loads):
    run = start("hot_waits_for_go", {})
    signal(run_id=run.id, name="go", payload={"now": True})  # seq 2: the claim is seq 3
    assert advance(str(run.id), owner="t") == Outcome.COMPLETED
    assert journal_loads == [str(run.id)]
    assert WorkflowRun.objects.get(id=run.id).result == {"go": {"now": True}, "then": 1}


def test_a_later_claim_replays_what_the_first_one_journaled(journal_loads):
    run = start("hot_waits_for_go", {})
    assert advance(str(run.id), owner="t") == Outcome.WAITING  # first claim: no read
    signal(run_id=run.id, name="go", payload=1)
    assert advance(str(run.id), owner="t") == Outcome.COMPLETED
    assert journal_loads == [str(run.id)]
    assert WorkflowRun.objects.get(id=run.id).result == {"go": 1, "then": 1}


def test_a_worker_runs_advance_jobs_without_leaving_rq_records_and_fails_a_broken_one_visibly():
    done = start("hot_two_steps", {})
    # A wake-up for a run id PostgreSQL refuses: the job raises (not a storage error).
    assert enqueue_advance("not-a-run-id", "0" * 64, compensating=True)
    queues = [get_queue(compensation_queue_name()), get_queue(queue_name_for(done.definition_hash))]
    worker = SagaWorker(queues, connection=redis_connection(), name=f"hot-{uuid.uuid4().hex[:8]}")

    worker.work(burst=True, with_scheduler=False, logging_level="WARNING")
    connection.close()  # the worker's job left its connection in a failed state on purpose

    assert WorkflowRun.objects.get(id=done.id).status == RunStatus.COMPLETED
    assert not redis_connection().exists(marker_key(str(done.id)))  # cleared when its job began
    conn = redis_connection()
    assert int(conn.hget(worker.key, "successful_job_count") or 0) == 1  # `rq info` still counts it
    assert int(conn.hget(worker.key, "failed_job_count") or 0) == 1
    failed = queues[0].failed_job_registry.get_job_ids()
    assert len(failed) == 1
    broken = Job.fetch(failed[0], connection=conn)
    assert broken.args == ("not-a-run-id",) and "not-a-run-id" in (broken.latest_result().exc_string or "")
    # The successful job left nothing behind in Redis: no job hash, nothing queued or started.
    job_keys = [k for k in conn.scan_iter("rq:job:*") if not k.decode().endswith(failed[0])]
    assert job_keys == []
    assert all(q.count == 0 and q.started_job_registry.count == 0 for q in queues)



def _nap(seconds: float) -> int:
    import time

    time.sleep(seconds)
    return 1


@workflow("hot_naps", version=1)
def hot_naps(ctx, spec):
    return ctx.step("nap", _nap, spec["nap"])


@pytest.fixture
def causes():
    """The causes of run_changed signals sent while the test runs, in order."""
    from sagas.events import run_changed

    seen: list[str] = []

    def record(sender, cause, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(cause)

    run_changed.connect(record, weak=False, dispatch_uid="test-hot-causes")
    yield seen
    run_changed.disconnect(dispatch_uid="test-hot-causes")


def test_a_claim_is_announced_only_if_the_run_is_still_under_way_a_moment_later(causes):
    from sagas.runtime.heartbeat import CLAIM_SIGNAL_DELAY

    quick = start("hot_naps", {"nap": 0})
    causes.clear()
    assert advance(str(quick.id), owner="t") == Outcome.COMPLETED
    assert causes == ["completed"]  # one signal: the run went PENDING -> COMPLETED for the pages

    slow = start("hot_naps", {"nap": CLAIM_SIGNAL_DELAY * 5})
    causes.clear()
    assert advance(str(slow.id), owner="t") == Outcome.COMPLETED
    assert causes[0] == "claimed" and causes[-1] == "completed"  # pages saw it RUNNING meanwhile


# --- a step's append straight through libpq (systemdb.Statement) -------------------------


def _claimed(workflow: str = "hot_two_steps"):  # type: ignore[no-untyped-def]
    run = start(workflow, {})
    claimed = systemdb.claim(str(run.id), owner="t", ttl=30)
    assert claimed is not None
    return claimed


def _append(claimed, name: str, *, fence: int | None = None, payload: str = '{"value":1}') -> int:  # type: ignore[no-untyped-def]
    return systemdb.append(claimed.id, fence=claimed.fence if fence is None else fence, kind="step", name=name,
                           payload=payload, worker="t").seq


def _counters(run_id: str) -> tuple[int, int, Decimal]:
    stored = WorkflowRun.objects.get(id=run_id)
    return stored.last_seq, stored.steps_used, stored.cost_used


def test_a_steps_append_is_prepared_once_per_connection_and_leaves_the_runs_row_to_the_renewal():
    claimed = _claimed()
    before = WorkflowRun.objects.values_list("updated_at", flat=True).get(id=claimed.id)
    assert [_append(claimed, f"s{i}", payload='{"value":1,"cost":0.25}') for i in range(3)] == [3, 4, 5]
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_prepared_statements WHERE name = 'sagas_append'")
        assert cur.fetchone() == (1,)  # prepared on this connection, once, under its own name
    assert _journal(claimed.id)[-3:] == [(3, "step", "s0"), (4, "step", "s1"), (5, "step", "s2")]
    # One row written per step, the entry: the run's row is as the claim left it ...
    assert _counters(claimed.id) == (2, 0, Decimal("0"))
    assert WorkflowRun.objects.values_list("updated_at", flat=True).get(id=claimed.id) == before
    # ... until the lease is renewed, which counts the steps and the cost in their payloads.
    assert systemdb.renew_lease(claimed.id, fence=claimed.fence, ttl=30)
    assert _counters(claimed.id) == (5, 3, Decimal("0.75"))
    assert systemdb.renew_lease(claimed.id, fence=claimed.fence, ttl=30)  # nothing new: nothing counted twice
    assert _counters(claimed.id) == (5, 3, Decimal("0.75"))


def test_an_append_inside_the_callers_transaction_is_rolled_back_with_it():
    claimed = _claimed()
    with pytest.raises(RuntimeError), transaction.atomic():
        assert _append(claimed, "inside") == 3
        raise RuntimeError("the caller's transaction fails")
    assert _journal(claimed.id) == [(1, "started", ""), (2, "claimed", "")]  # a bare libpq call would have committed
    assert _append(claimed, "after") == 3
    assert systemdb.renew_lease(claimed.id, fence=claimed.fence, ttl=30)
    assert _counters(claimed.id)[:2] == (3, 1)


def test_an_appends_errors_are_djangos_and_a_stale_fence_writes_nothing():
    from django.db import DataError

    from sagas.errors import LeaseLost

    claimed = _claimed()
    with pytest.raises(DataError, match="invalid input syntax for type json"):
        _append(claimed, "bad", payload="{not json")
    with pytest.raises(LeaseLost, match="fence .* is stale"):
        _append(claimed, "late", fence=claimed.fence - 1)
    assert _journal(claimed.id) == [(1, "started", ""), (2, "claimed", "")]


def test_an_append_after_the_server_dropped_the_connection_reconnects_and_prepares_again():
    from django.db import OperationalError

    from core.storage import note_failure

    claimed = _claimed()
    assert _append(claimed, "before") == 3
    old_pid = connection.connection.info.backend_pid
    with psycopg_admin() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [old_pid])
    with pytest.raises(OperationalError) as failed:
        _append(claimed, "lost")
    note_failure(failed.value, doing="the test's append")  # what JournalCursor.durably does: drop the dead connection
    assert _append(claimed, "after") == 4  # a new connection, the statement prepared on it again
    assert connection.connection.info.backend_pid != old_pid
    assert [name for _, _, name in _journal(claimed.id)] == ["", "", "before", "after"]


def psycopg_admin():  # type: ignore[no-untyped-def]
    import psycopg

    settings = connection.settings_dict
    return psycopg.connect(host=settings["HOST"], port=settings["PORT"] or 5432, user=settings["USER"],
                           dbname=settings["NAME"], autocommit=True)


def test_a_run_with_journal_entries_cannot_be_deleted_without_them():
    from django.db import IntegrityError

    claimed = _claimed()
    with pytest.raises(IntegrityError, match="still has journal entries"), connection.cursor() as cur:
        cur.execute("DELETE FROM sagas_workflowrun WHERE id = %s", [claimed.id])
    assert WorkflowRun.objects.filter(id=claimed.id).exists()
    assert len(_journal(claimed.id)) == 2


# --- the heartbeat: one thread per worker thread, serving its runs one after another ------


def _claim_from_another_thread(run_id: str) -> bool:
    """Whether another worker could take the run now (its lease lapsed)."""
    import threading

    taken: list[bool] = []

    def other() -> None:
        try:
            taken.append(systemdb.claim(run_id, owner="other", ttl=30) is not None)
        finally:
            connection.close()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    return taken[0]


def _outlast_the_lease(run_id: str, seconds: float) -> bool:
    time.sleep(seconds)
    return _claim_from_another_thread(run_id)


@workflow("hot_long_step", version=1)
def hot_long_step(ctx, spec):
    return ctx.step("long", _outlast_the_lease, ctx.run_id, spec["seconds"])


def test_each_run_on_a_thread_keeps_its_lease_through_a_long_step_and_releases_it_after(settings):
    settings.SAGAS_LEASE_TTL = 0.6  # renewed every 0.2 s
    first, second = start("hot_long_step", {"seconds": 1.5}), start("hot_long_step", {"seconds": 1.5})
    for run in (first, second):  # the same thread, one after the other: the heartbeat serves both
        assert advance(str(run.id), owner="t") == Outcome.COMPLETED
        stored = WorkflowRun.objects.get(id=run.id)
        assert stored.result is False  # 2.5 leases into the step, no other worker could take the run
        assert (stored.lease_owner, stored.lease_expires_at) == ("", None)
    time.sleep(0.5)  # a renewal still running after the run ended would show here
    assert WorkflowRun.objects.filter(id__in=[first.id, second.id], lease_expires_at__isnull=False).count() == 0


def test_a_waiting_run_is_not_held_by_a_late_renewal(settings):
    settings.SAGAS_LEASE_TTL = 0.3
    run = start("hot_waits_for_go", {})
    assert advance(str(run.id), owner="t") == Outcome.WAITING
    time.sleep(0.4)
    signal(run_id=run.id, name="go", payload=2)
    assert advance(str(run.id), owner="t2") == Outcome.COMPLETED  # claimable at once: no lease left behind


def test_a_claim_reads_the_same_run_inside_a_transaction_as_through_libpq():
    run = start("hot_two_steps", {"order": [1, "é"], "note": "x"}, max_steps=7, max_cost=1.5)
    with transaction.atomic():
        inside = systemdb.claim(str(run.id), owner="t", ttl=30)  # psycopg's cursor, in the transaction
        transaction.set_rollback(True)
    outside = systemdb.claim(str(run.id), owner="t", ttl=30)  # libpq, prepared
    assert inside is not None and outside is not None
    assert inside == outside.__class__(**{**outside.__dict__, "started_at": inside.started_at})
    assert (outside.input, outside.max_steps, outside.max_cost, outside.max_duration_seconds) == (
        {"order": [1, "é"], "note": "x"}, 7, Decimal("1.5"), 3600.0)
    assert outside.started_at == WorkflowRun.objects.get(id=run.id).started_at


def test_a_step_is_recorded_after_the_servers_prepared_statements_were_dropped():
    claimed = _claimed()
    assert _append(claimed, "before") == 3
    with connection.cursor() as cur:
        cur.execute("DEALLOCATE ALL")  # what a pooler's DISCARD ALL or a person's psql session can do
    assert _append(claimed, "after") == 4  # prepared again, not a failed step
    assert [name for _, _, name in _journal(claimed.id)] == ["", "", "before", "after"]


def test_finish_sends_its_status_guard_time_and_flag_the_same_way_on_both_paths():
    from datetime import UTC, datetime

    from sagas.models import RunStatus as S

    wake = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    for inside in (True, False):
        claimed = _claimed()
        kwargs = dict(fence=claimed.fence, status=S.WAITING, kind="suspended", worker="t", payload={"why": "é\"x"},
                      wake_at=wake, terminal=False)
        if inside:
            with transaction.atomic():
                systemdb.finish(claimed.id, **kwargs)
        else:
            systemdb.finish(claimed.id, **kwargs)
        stored = WorkflowRun.objects.get(id=claimed.id)
        assert (stored.status, stored.wake_at, stored.finished_at, stored.lease_owner) == (S.WAITING, wake, None, "")
        assert JournalEntry.objects.get(run_id=claimed.id, kind="suspended").payload == {"why": "é\"x"}


def test_a_renewal_that_lands_after_the_run_was_released_holds_no_lease():
    """The heartbeat renews on its own thread: a renewal that commits just after the run was
    suspended or finished (same fence) must not lease the released run again. It did: the
    WAITING run kept ``lease_expires_at`` a ttl ahead, and the approval or signal that woke it
    found it unclaimable until then."""
    from django.utils import timezone

    waiting = _claimed("hot_waits_for_go")
    assert systemdb.suspend(waiting.id, fence=waiting.fence, worker="t", expect_last_seq=2,
                            wake_at=timezone.now() + timedelta(hours=1), payload={"reason": "go"})
    assert not systemdb.renew_lease(waiting.id, fence=waiting.fence, ttl=30)
    stored = WorkflowRun.objects.get(id=waiting.id)
    assert (stored.status, stored.lease_owner, stored.lease_expires_at) == (RunStatus.WAITING, "", None)
    signal(run_id=waiting.id, name="go", payload=1)
    assert systemdb.claim(str(waiting.id), owner="t2", ttl=30) is not None  # the woken run is claimed at once

    done = _claimed()
    systemdb.finish(done.id, fence=done.fence, status=RunStatus.COMPLETED, kind="completed", worker="t",
                    payload={"result": 1}, result=1, terminal=True)
    assert not systemdb.renew_lease(done.id, fence=done.fence, ttl=30)
    assert WorkflowRun.objects.values_list("lease_expires_at", flat=True).get(id=done.id) is None

"""Numbering and counting when a step writes only its journal entry (``sagas.store.numbering``).

Each race is made to happen on every run: one writer's transaction is held open at the
moment that matters, and the other is started and waited for until PostgreSQL shows it
blocked by that very transaction (``pg_blocking_pids`` of its backend names the holder's), with
no time limit a slow machine could miss; then the first commits. What is checked is what a
user sees: every entry kept once, seqs gap-free, the run's step and cost counters exact, a
worker that lost its run writing nothing, a decision that arrived not slept through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from sagas import start
from sagas.errors import LeaseLost
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.services import run_cancel
from sagas.store import numbering, systemdb
from sagas.versions.registry import workflow

pytestmark = pytest.mark.django_db(transaction=True)


@workflow("numbering_steps", version=1)
def numbering_steps(ctx, spec):
    return ctx.step("a", int)


STEP = '{"value":1,"cost":0.5}'


def _claimed(owner: str = "a") -> systemdb.ClaimedRun:
    run = start("numbering_steps", {})
    claimed = systemdb.claim(str(run.id), owner=owner, ttl=30)
    assert claimed is not None
    return claimed


def _step(claimed: systemdb.ClaimedRun, name: str, *, fence: int | None = None) -> int:
    return systemdb.append(claimed.id, fence=claimed.fence if fence is None else fence, kind="step", name=name,
                           payload=STEP, worker=claimed.id[:4]).seq


def _journal(run_id: str) -> list[tuple[int, str, str]]:
    return list(JournalEntry.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "kind", "name"))


def _counters(run_id: str) -> tuple[int, int, Decimal]:
    return WorkflowRun.objects.values_list("last_seq", "steps_used", "cost_used").get(id=run_id)


def _expire_lease(run_id: str) -> None:
    WorkflowRun.objects.filter(id=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def _other_connection() -> psycopg.Connection:
    s = connection.settings_dict
    return psycopg.connect(host=s["HOST"], port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"])


# Only a guard against a real hang: no wait below gives up because the machine is slow. Each
# one waits for an observable state (a backend blocked by a given pid, a thread that ended).
HANG = 300.0


class InThread:
    """``fn()`` on a thread of its own (its own Django connection); ``result()`` joins it.
    ``pid`` is that connection's backend pid, known once the constructor returns."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.pid: int | None = None
        connected = threading.Event()

        def body() -> None:
            try:
                connection.ensure_connection()
                self.pid = connection.connection.info.backend_pid
                connected.set()
                self.value = fn()
            except BaseException as exc:  # noqa: BLE001 -- handed to the test
                self.error = exc
            finally:
                connected.set()
                connection.close()

        self.thread = threading.Thread(target=body, daemon=True)
        self.thread.start()
        assert connected.wait(timeout=HANG), "the thread never connected"
        if self.pid is None:  # it could not even connect
            self.result()

    def result(self) -> Any:
        self.thread.join(timeout=HANG)
        assert not self.thread.is_alive(), "the other writer hung"
        if self.error is not None:
            raise self.error
        return self.value


_releases: list[threading.Event] = []


@pytest.fixture(autouse=True)
def _release_held_transactions():
    """A test that failed before releasing a held transaction does not leave it open."""
    yield
    while _releases:
        _releases.pop().set()


def _held_open(write: Callable[[], Any]) -> tuple[InThread, threading.Event]:
    """``write()`` inside a transaction on a thread of its own, left open until the returned
    event is set; returns once the write has run (its locks are held, nothing committed)."""
    holding, release = threading.Event(), threading.Event()
    _releases.append(release)

    def body() -> Any:
        from django.db import transaction

        with transaction.atomic():
            value = write()
            holding.set()
            assert release.wait(timeout=HANG), "never released"
        return value

    thread = InThread(body)
    deadline = time.monotonic() + HANG
    while not holding.wait(timeout=0.01):
        if not thread.thread.is_alive():
            thread.result()  # the write failed: its error, not a timeout
            raise AssertionError("the write ended without holding its transaction open")
        assert time.monotonic() < deadline, "the write hung"
    return thread, release


def _wait_until_blocked(waiter: InThread, by: int) -> None:
    """Until PostgreSQL shows ``waiter``'s backend waiting for a lock held by backend ``by``
    (``pg_blocking_pids``): the other writer reached the race. Fails only if the waiter ends
    without having waited for ``by`` (the race did not happen), however long either takes."""
    assert waiter.pid is not None
    deadline = time.monotonic() + HANG
    with _other_connection() as admin:
        admin.autocommit = True
        while True:
            row = admin.execute("SELECT pg_blocking_pids(%s)", [waiter.pid]).fetchone()
            if row and by in row[0]:
                return
            if not waiter.thread.is_alive():
                outcome = f"error {waiter.error!r}" if waiter.error is not None else f"value {waiter.value!r}"
                raise AssertionError(f"the other writer ended ({outcome}) without waiting for backend {by}: "
                                     "the race did not happen")
            assert time.monotonic() < deadline, f"backend {waiter.pid} neither blocked on {by} nor finished"
            time.sleep(0.005)


def _in_flight_step(conn: psycopg.Connection, claimed: systemdb.ClaimedRun, name: str) -> int:
    """The worker's step statement, sent on ``conn`` inside a transaction left open: a step
    whose commit is in flight."""
    with psycopg.RawCursor(conn) as cur:
        cur.execute(systemdb._APPEND_SQL, [claimed.id, claimed.fence, "step", name, STEP, "a"])
        row = cur.fetchone()
    assert row is not None
    return int(row[0])


def test_a_claim_that_meets_a_steps_commit_in_flight_numbers_itself_after_it_and_counts_it():
    claimed = _claimed()
    _step(claimed, "s1")
    _expire_lease(claimed.id)  # the holder is presumed dead, but one step of its is still committing
    with _other_connection() as holder:
        assert _in_flight_step(holder, claimed, "s2") == 4
        claim = InThread(lambda: systemdb.claim(claimed.id, owner="b", ttl=30))
        # the claim took seq 4 too and waits on the unique index
        _wait_until_blocked(claim, by=holder.info.backend_pid)
        holder.commit()
    taken = claim.result()
    assert taken is not None and taken.fence == claimed.fence + 1
    assert _journal(claimed.id) == [(1, "started", ""), (2, "claimed", ""), (3, "step", "s1"), (4, "step", "s2"),
                                    (5, "claimed", "")]
    assert (taken.last_seq, taken.steps_used, taken.cost_used) == (5, 2, Decimal("1.0"))
    with pytest.raises(LeaseLost):  # the old holder's next step is refused
        _step(claimed, "s3")
    assert len(_journal(claimed.id)) == 5


def test_a_step_that_meets_a_claims_commit_in_flight_is_refused_and_the_claim_keeps_the_journal_whole():
    claimed = _claimed()
    _step(claimed, "s1")
    _expire_lease(claimed.id)
    with _other_connection() as claimer:
        with psycopg.RawCursor(claimer) as cur:
            cur.execute(systemdb._CLAIM_SQL, [claimed.id, "b", 30.0, systemdb._CLAIMABLE])
            assert cur.fetchone() is not None  # the claim's entry is 4, uncommitted
        late = InThread(lambda: _step(claimed, "s2"))
        _wait_until_blocked(late, by=claimer.info.backend_pid)
        claimer.commit()
    with pytest.raises(LeaseLost):
        late.result()
    assert _journal(claimed.id) == [(1, "started", ""), (2, "claimed", ""), (3, "step", "s1"), (4, "claimed", "")]
    assert _counters(claimed.id) == (4, 1, Decimal("0.5"))


def test_an_event_that_meets_a_steps_commit_in_flight_numbers_itself_after_it_and_counts_it():
    claimed = _claimed()
    with _other_connection() as holder:
        assert _in_flight_step(holder, claimed, "s1") == 3
        event = InThread(lambda: systemdb.append_event(claimed.id, kind="signal_received", name="go",
                                                       payload="{}", worker="api"))
        _wait_until_blocked(event, by=holder.info.backend_pid)
        holder.commit()
    assert event.result() == 4
    assert _journal(claimed.id)[2:] == [(3, "step", "s1"), (4, "signal_received", "go")]
    assert _counters(claimed.id) == (4, 1, Decimal("0.5"))
    assert _step(claimed, "s2") == 5  # the holder goes on after the event


def test_a_step_that_meets_an_events_commit_in_flight_is_numbered_after_it():
    claimed = _claimed()
    event, release = _held_open(lambda: systemdb.append_event(claimed.id, kind="signal_received", name="go",
                                                               payload="{}", worker="api"))
    step = InThread(lambda: _step(claimed, "s1"))
    _wait_until_blocked(step, by=event.pid)  # the step took seq 3 too and waits for the event's transaction
    release.set()
    assert event.result() == 3
    assert step.result() == 4
    assert _journal(claimed.id)[2:] == [(3, "signal_received", "go"), (4, "step", "s1")]


def test_a_claim_that_waited_for_a_workers_transaction_numbers_itself_after_its_entry_and_counts_it():
    claimed = _claimed()
    _expire_lease(claimed.id)
    intent, release = _held_open(lambda: systemdb.append(  # as the ledger records an effect's intent
        claimed.id, fence=claimed.fence, kind="effect_intent", name="charge", payload='{"key":"k"}', worker="a"))
    claim = InThread(lambda: systemdb.claim(claimed.id, owner="b", ttl=30))
    _wait_until_blocked(claim, by=intent.pid)  # the worker holds the run's row FOR SHARE: the claim waits for it
    release.set()
    assert intent.result().seq == 3
    taken = claim.result()
    assert taken is not None
    assert (taken.last_seq, taken.steps_used) == (4, 1)  # after the intent, which counts as a step
    assert [kind for _, kind, _ in _journal(claimed.id)] == ["started", "claimed", "effect_intent", "claimed"]


def test_a_claim_that_waited_for_a_hand_back_counts_each_step_once():
    claimed = _claimed()
    _step(claimed, "s1")
    _step(claimed, "s2")
    _expire_lease(claimed.id)
    with _other_connection() as holder:
        with psycopg.RawCursor(holder) as cur:  # the holder hands the run back: its finish, uncommitted
            cur.execute(systemdb._FINISH_SQL, [claimed.id, claimed.fence, RunStatus.PENDING, "yielded", None, None,
                                               None, False, systemdb.sources(RunStatus.PENDING), None,
                                               "yielded", "{}", "a"])
            assert cur.fetchone() is not None
        claim = InThread(lambda: systemdb.claim(claimed.id, owner="b", ttl=30))
        # waits for the run's row; PostgreSQL re-checks it after the commit
        _wait_until_blocked(claim, by=holder.info.backend_pid)
        holder.commit()
    taken = claim.result()
    assert taken is not None
    assert (taken.last_seq, taken.steps_used, taken.cost_used) == (6, 2, Decimal("1.0"))  # counted once, not twice
    assert [kind for _, kind, _ in _journal(claimed.id)] == ["started", "claimed", "step", "step", "yielded", "claimed"]


def test_a_decision_that_arrives_while_the_worker_parks_its_run_is_not_slept_through():
    claimed = _claimed()
    view = _step(claimed, "s1")
    with _other_connection() as approver:
        with psycopg.RawCursor(approver) as cur:  # an event writer's transaction, holding the run's row
            cur.execute(systemdb._APPEND_EVENT_SQL.replace("%(run)s", "$1").replace("%(kind)s", "$2")
                        .replace("%(name)s", "$3").replace("%(payload)s", "$4").replace("%(worker)s", "$5"),
                        [claimed.id, "approval_decided", "ship", '{"approved":true}', "ann"])
            assert cur.fetchone() == (view + 1,)
        parked = InThread(lambda: systemdb.suspend(claimed.id, fence=claimed.fence, worker="a", expect_last_seq=view,
                                                   wake_at=None, payload={"waiting_for": "ship"}))
        _wait_until_blocked(parked, by=approver.info.backend_pid)
        approver.commit()
    assert parked.result() is False  # refused: the worker replays and sees the decision
    stored = WorkflowRun.objects.get(id=claimed.id)
    assert stored.status == RunStatus.RUNNING
    assert (stored.last_seq, stored.steps_used) == (view + 1, 1)
    assert systemdb.suspend(claimed.id, fence=claimed.fence, worker="a", expect_last_seq=view + 1, wake_at=None,
                            payload={}) is True  # with the decision in its view, it may park


def test_a_crashed_holders_uncounted_steps_are_counted_by_the_next_claim():
    claimed = _claimed()
    for i in range(3):
        _step(claimed, f"s{i}")
    assert _counters(claimed.id) == (2, 0, Decimal("0"))  # the holder died before any renewal
    _expire_lease(claimed.id)
    taken = systemdb.claim(claimed.id, owner="b", ttl=30)
    assert taken is not None
    assert (taken.last_seq, taken.steps_used, taken.cost_used) == (6, 3, Decimal("1.5"))
    assert _counters(claimed.id) == (6, 3, Decimal("1.5"))


def test_cancelling_a_running_run_shows_the_steps_it_took():
    claimed = _claimed()
    _step(claimed, "s1")
    _step(claimed, "s2")
    run_cancel(run_id=claimed.id, user=None, reason="customer called", compensate=False)
    stored = WorkflowRun.objects.get(id=claimed.id)
    assert (stored.status, stored.steps_used, stored.cost_used, stored.last_seq) == (
        RunStatus.CANCELLED, 2, Decimal("1.0"), 5)
    with pytest.raises(LeaseLost):
        _step(claimed, "s3")


def test_a_writer_that_keeps_losing_its_seq_gives_up_with_the_databases_error(monkeypatch):
    from django.db import IntegrityError

    monkeypatch.setattr(numbering, "ATTEMPTS", 1)
    claimed = _claimed()
    with _other_connection() as holder:
        _in_flight_step(holder, claimed, "s1")
        event = InThread(lambda: systemdb.append_event(claimed.id, kind="signal_received", name="go",
                                                       payload="{}", worker="api"))
        _wait_until_blocked(event, by=holder.info.backend_pid)
        holder.commit()
    with pytest.raises(IntegrityError, match="journal_unique_run_seq"):
        event.result()
    assert _journal(claimed.id)[2:] == [(3, "step", "s1")]

"""The fast dispatch path (sagas.runtime.dispatch): a run made runnable is taken by an idle
worker thread on its commit's NOTIFY, RQ's job for it is cleared away without a second claim,
and a worker with no free thread leaves it to the queues."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings

from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.runtime.queue import get_queue, queue_name_for, redis_connection
from tests.procs import run_python, wait_until, worker_env
from tests.sagas import wf_engine  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_engine"


def claims(run_id) -> list[str]:
    return list(JournalEntry.objects.filter(run_id=run_id, kind="claimed").values_list("worker_id", flat=True))


@override_settings(SAGAS_DISPATCH_RQ_DELAY=0.05)  # the product's default: RQ's job comes a moment later
def test_an_idle_worker_takes_a_new_run_on_its_commit_and_claims_it_once(procs, step_calls):
    worker = procs.worker("w1", MODULES)
    wait_until(lambda: _listening() == ["sagas_worker w1"], timeout=30, what="the worker listening")
    runs = []
    for _ in range(5):  # one at a time: each finds the worker's one thread free
        runs.append(start("five_steps", {}).id)
        wait_until(lambda: WorkflowRun.objects.get(id=runs[-1]).status == RunStatus.COMPLETED, timeout=30,
                   what="the run completed")
        # The thread gives its slot back just after the run's last commit: under load (CI, the
        # suite beside it) the next announcement could come first and go to RQ's queue instead.
        time.sleep(0.3)
    for run_id in runs:
        assert claims(run_id) == ["w1/f1"], claims(run_id)  # the fast thread; RQ's job never claimed it
    assert step_calls.counts(runs[0]) == {f"s{i}": 1 for i in range(1, 6)}
    # RQ's jobs for them were cleared away, not left in the queue or re-run.
    wait_until(lambda: get_queue(queue_name_for(WorkflowRun.objects.get(id=runs[0]).definition_hash)).count == 0,
               timeout=10, what="the queue empty")
    assert not any(redis_connection().exists(f"sagas:queued:{run_id}") for run_id in runs)
    assert worker.alive()


@override_settings(SAGAS_DISPATCH_RQ_DELAY=0.05)
def test_a_busy_worker_leaves_announcements_to_the_queues(procs, step_calls):
    procs.worker("w1", MODULES)
    wait_until(lambda: _listening() == ["sagas_worker w1"], timeout=30, what="the worker listening")
    slow = start("slow_steps", {"steps": 1, "pause": 1.5}).id
    wait_until(lambda: WorkflowRun.objects.get(id=slow).status == RunStatus.RUNNING, timeout=30,
               what="the slow run under way")
    quick = start("five_steps", {}).id  # the only slot is busy: RQ's job brings it once it frees
    wait_until(lambda: WorkflowRun.objects.get(id=quick).status == RunStatus.COMPLETED, timeout=30,
               what="the quick run completed")
    assert claims(quick) == ["w1"], claims(quick)


def _listening() -> list[str]:
    """The sessions that listen for dispatch announcements, by name: the worker's listener
    carries its process's name, so ending a worker's sessions by name ends it too."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query = 'LISTEN sagas_dispatch'")
        return [name for (name,) in cur.fetchall()]


def test_a_script_that_starts_a_run_and_exits_at_once_leaves_its_wake_up_behind():
    """start()'s RQ wake-up goes out a moment after the commit, from a thread; a script that
    starts a run and exits sends it on its way out, not never (and not the sweeper's pass later)."""
    code = ("import django; django.setup()\n"
            "from sagas import start\n"
            "print(start('five_steps', {}).id)\n")
    done = run_python(["-c", code], env=worker_env(MODULES, SAGAS_DISPATCH_RQ_DELAY="30"), timeout=60)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip().splitlines()[-1]
    assert WorkflowRun.objects.get(id=run_id).status == RunStatus.PENDING
    assert redis_connection().exists(f"sagas:queued:{run_id}"), "the wake-up was not sent before the exit"
    assert get_queue(queue_name_for(WorkflowRun.objects.get(id=run_id).definition_hash)).count == 1


def test_a_slot_given_back_goes_to_the_queued_run_waiting_for_it_not_to_the_next_announcement():
    """A saturated process: an RQ thread holds the job it dequeued (the oldest of the highest
    priority) and waits for a slot. While it waits, announcements of new runs (10,000 started in
    batches, say) must not take the slot that frees: they took most of them, and runs let go by
    flow control, woken through the first queue, waited behind runs not started yet."""
    import threading

    from sagas.runtime.dispatch import Slots

    slots = Slots(1)
    slots.take()  # the process's one slot, busy with a run
    got = threading.Event()

    def rq_thread() -> None:
        slots.take()
        got.set()

    waiter = threading.Thread(target=rq_thread, daemon=True)
    waiter.start()
    time.sleep(0.2)  # the RQ thread blocks in take() (and is counted as waiting, where that is counted)
    wait_until(lambda: getattr(slots, "_waiting", 1) >= 1, timeout=10, what="the RQ thread waiting for a slot")
    assert not slots.try_take()  # an announcement while the slot is busy: RQ's queues decide
    slots.give_back()  # the run finishes; an announcement arrives at once
    assert not slots.try_take(), "an announcement took the slot the queued run was waiting for"
    assert got.wait(5), "the RQ thread waiting with its job did not get the freed slot"
    assert not slots.try_take()  # the RQ thread holds it now
    slots.give_back()
    assert slots.try_take()  # nobody waits: a free slot is the next announcement's
    waiter.join(5)

"""Crash, replay and recovery with real worker processes, real SIGKILLs, real PostgreSQL and Redis."""

from __future__ import annotations

import signal
import time

import pytest
from django.conf import settings
from rq import Worker

from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkflowRun
from sagas.runtime.queue import redis_connection
from tests.procs import wait_until, worker_env
from tests.sagas import wf_engine  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_engine"


def status(run) -> str:
    return WorkflowRun.objects.values_list("status", flat=True).get(id=run.id)


def rq_state(name: str) -> str | None:
    """A worker's state in RQ's registry ("idle" once it waits for jobs), None if unregistered."""
    worker = Worker.find_by_key(Worker.redis_worker_namespace_prefix + name, connection=redis_connection())
    return worker.get_state() if worker is not None else None


def test_it_resumes_a_killed_run_without_repeating_finished_steps(procs, step_calls):
    run = start("five_steps", {"slow_step3": 30.0})
    first = procs.worker("w1", MODULES)
    wait_until(lambda: step_calls.counts(run.id).get("s3"), 20, what="step 3 to start in w1")
    assert WorkflowRun.objects.get(id=run.id).lease_owner == "w1"

    second = procs.worker("w2", MODULES)
    # w2 is up and idle before the kill, so what follows is recovery, not start-up.
    wait_until(lambda: rq_state("w2") == "idle", 30, what="w2 to wait for jobs")
    killed_at = time.monotonic()
    first.kill()
    lease_ended = WorkflowRun.objects.values_list("lease_expires_at", flat=True).get(id=run.id)
    wait_until(lambda: step_calls.counts(run.id).get("s4"), settings.SAGAS_LEASE_TTL + 30,
               what="step 4 after recovery")
    print(f"recovered {time.monotonic() - killed_at:.2f}s after the SIGKILL (lease TTL "
          f"{settings.SAGAS_LEASE_TTL}s, sweep every {settings.SAGAS_SWEEP_INTERVAL}s)")
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 10, what="completion")

    run.refresh_from_db()
    assert run.result == ["s1-done", "s2-done", "s3-done", "s4-done", "s5-done"]
    counts = step_calls.counts(run.id)
    assert counts["s1"] == 1 and counts["s2"] == 1, counts
    assert 1 <= counts["s3"] <= 2, counts
    assert counts["s4"] == 1 and counts["s5"] == 1, counts
    assert run.attempts == 2
    assert run.lease_owner == ""
    # Nothing but the lease stood between the kill and recovery: w2 ran s3 again once the dead
    # worker's lease had run out (PostgreSQL's clock for both), never while it still held.
    pid, _, again_at = step_calls.rows(run.id, "s3")[-1]
    assert pid == second.pid and again_at >= lease_ended, (pid, again_at, lease_ended)
    steps = list(JournalEntry.objects.filter(run=run, kind="step").values_list("name", "worker_id"))
    assert steps == [("s1", "w1"), ("s2", "w1"), ("s3", "w2"), ("s4", "w2"), ("s5", "w2")]
    assert second.alive()


def test_it_runs_an_executed_but_unrecorded_step_again_and_nothing_else(procs, step_calls):
    run = start("five_steps", {})
    procs.worker("w1", MODULES, SAGAS_CRASH_AT="after_step:s2")  # s2 ran; its result is not journaled
    wait_until(lambda: not procs.procs[0].alive(), 20, what="w1 to crash at after_step:s2")
    assert procs.procs[0].popen.returncode == 97
    procs.worker("w2", MODULES)
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 20, what="completion on w2")
    assert step_calls.counts(run.id) == {"s1": 1, "s2": 2, "s3": 1, "s4": 1, "s5": 1}


def test_it_stops_a_run_whose_code_asks_for_steps_in_another_order(procs, step_calls):
    run = start("nd_order", {})
    procs.worker("w1", MODULES, ND_ORDER="ab", SAGAS_CRASH_AT="after_step_record:a")
    wait_until(lambda: not procs.procs[0].alive(), 20, what="w1 to crash after recording step a")
    procs.worker("w2", MODULES, ND_ORDER="ba")
    wait_until(lambda: status(run) == RunStatus.NEEDS_ATTENTION, 20, what="the run to need attention")

    run.refresh_from_db()
    assert run.status_reason == "non_determinism"
    assert "step 'a'" in run.error["message"] and "step 'b'" in run.error["message"], run.error
    assert run.error["journal"]["name"] == "a" and run.error["code_asked"]["name"] == "b"
    assert step_calls.counts(run.id) == {"a": 1}  # b never ran: the mismatch stopped it first
    halted = JournalEntry.objects.get(run=run, kind="halted")
    assert halted.payload["code"] == "non_determinism"


def test_it_returns_recorded_now_random_and_uuid_on_replay(procs, step_calls):
    run = start("recorded_values", {})
    procs.worker("w1", MODULES, SAGAS_CRASH_AT="after_step_record:remember")
    wait_until(lambda: not procs.procs[0].alive(), 20, what="w1 to crash after 'remember'")
    time.sleep(0.05)
    procs.worker("w2", MODULES)
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 20, what="completion on w2")

    run.refresh_from_db()
    [(pid, first_values, _)] = step_calls.rows(run.id, "remember")
    assert run.result == first_values  # w2 replayed w1's values instead of drawing new ones
    assert step_calls.counts(run.id) == {"remember": 1, "after": 1}
    assert run.attempts == 2


def test_it_refuses_writes_from_a_worker_whose_lease_was_taken_over(procs, step_calls):
    run = start("five_steps", {"slow_step3": 1.5})
    stale = procs.worker("w1", MODULES)
    wait_until(lambda: step_calls.counts(run.id).get("s3"), 20, what="step 3 to start in w1")
    stale.signal(signal.SIGSTOP)  # frozen mid-step: no heartbeat, the lease runs out
    procs.worker("w2", MODULES)
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 30, what="w2 to take over and finish")
    stale.signal(signal.SIGCONT)  # w1 wakes up, finishes s3 and tries to journal it
    wait_until(lambda: "lease lost" in stale.log(), 15, what="w1 to notice it lost the lease")

    entries = list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("seq", "kind", "name", "worker_id"))
    assert [e[0] for e in entries] == list(range(1, len(entries) + 1))  # one entry per seq, no gaps
    steps = [(name, worker) for _, kind, name, worker in entries if kind == "step"]
    assert steps == [("s1", "w1"), ("s2", "w1"), ("s3", "w2"), ("s4", "w2"), ("s5", "w2")]
    claims = [worker for _, kind, _, worker in entries if kind == "claimed"]
    assert claims == ["w1", "w2"]
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED and run.fence == 2
    assert step_calls.counts(run.id)["s3"] == 2  # w1 ran it, but could not record it
    assert stale.alive()  # a stale worker stops the run, not itself


def test_it_completes_every_run_after_redis_is_flushed_mid_run(procs, step_calls):
    runs = [start("slow_steps", {"steps": 6, "pause": 0.1}) for _ in range(12)]
    procs.worker("w1", MODULES)
    procs.worker("w2", MODULES)
    wait_until(
        lambda: WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() >= 2, 30, what="some progress"
    )
    redis_connection().flushdb()  # every queued wake-up is gone; PostgreSQL still knows
    unfinished = WorkflowRun.objects.exclude(status=RunStatus.COMPLETED).count()
    assert unfinished > 0
    wait_until(
        lambda: WorkflowRun.objects.filter(status=RunStatus.COMPLETED).count() == len(runs), 60,
        what="all runs to complete after the flush",
    )
    for run in runs:
        counts = step_calls.counts(run.id)
        assert counts == {f"tick{i}": 1 for i in range(6)}, counts


def test_it_hands_a_run_back_when_its_worker_is_stopped_gracefully(procs, step_calls):
    run = start("slow_steps", {"steps": 40, "pause": 0.1})
    first = procs.worker("w1", MODULES)
    wait_until(lambda: len(step_calls.counts(run.id)) >= 3, 20, what="a few steps on w1")
    first.signal(signal.SIGTERM)
    first.popen.wait(timeout=20)
    run.refresh_from_db()
    assert run.status == RunStatus.PENDING and run.lease_owner == ""  # handed back, not left leased
    procs.worker("w2", MODULES)
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 30, what="w2 to finish the run")
    assert all(n == 1 for n in step_calls.counts(run.id).values())
    assert JournalEntry.objects.filter(run=run, kind="yielded").count() == 1


def test_the_standalone_sweeper_reenqueues_a_lost_wakeup_and_stops_cleanly_on_sigterm(procs, step_calls):
    """``sagas_sweep --loop`` (for deployments whose workers run with --no-sweep) finds a run
    whose wake-up Redis lost, reports what it did, and exits 0 between passes on SIGTERM."""
    run = start("five_steps", {})
    redis_connection().flushdb()  # the run's wake-up is gone; only PostgreSQL knows about it
    procs.worker("w1", MODULES, "--no-sweep")
    time.sleep(1.5)
    assert status(run) == RunStatus.PENDING  # nobody is looking for it

    sweeper = procs.start("sweeper", ["manage.py", "sagas_sweep", "--loop", "--interval", "0.2"],
                          worker_env(MODULES))
    wait_until(lambda: status(run) == RunStatus.COMPLETED, 30, what="the swept run to complete")
    # The pass prints its line when it ends, which on a slow machine can be after the worker has
    # already completed the run the pass re-enqueued.
    wait_until(lambda: "sweep #1: expired=0 orphaned=1" in sweeper.log(), 15, what="the sweeper's report")
    sweeper.popen.send_signal(signal.SIGTERM)
    assert sweeper.popen.wait(timeout=10) == 0
    assert "sweeper stopped after" in sweeper.log()
    assert step_calls.counts(run.id) == {f"s{i}": 1 for i in range(1, 6)}

"""One worker process advancing several runs at once (sagas_worker --concurrency N), with real
worker processes, real signals, real PostgreSQL and Redis."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from sagas import start
from sagas.models import JournalEntry, RunStatus, WorkerProcess, WorkflowRun
from tests.procs import wait_until
from tests.sagas import wf_engine  # noqa: F401  (registers the workflows in this process)

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_engine"
THREADS = {"w1/1", "w1/2", "w1/3"}


def statuses(runs) -> list[str]:
    return list(WorkflowRun.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True))


def all_completed(runs) -> bool:
    return statuses(runs) == [RunStatus.COMPLETED] * len(runs)


def journal(run) -> list[tuple[int, str, str, str]]:
    return list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("seq", "kind", "name", "worker_id"))


def steps_started(step_calls, runs, at_least: int) -> bool:
    return all(sum(step_calls.counts(r.id).values()) >= at_least for r in runs)


def test_it_advances_three_runs_at_once_in_one_process(procs, step_calls):
    runs = [start("slow_steps", {"steps": 4, "pause": 0.4}) for _ in range(3)]
    worker = procs.worker("w1", MODULES, "--concurrency", "3")
    wait_until(lambda: all_completed(runs), 30, what="the three runs to complete")

    spans = []
    for run in runs:
        ats = [at for i in range(4) for _, _, at in step_calls.rows(run.id, f"tick{i}")]
        assert len(ats) == 4
        spans.append((min(ats), max(ats)))
    # Every run had started its first step before any run started its last one:
    # the three were in progress at the same time, not one after another.
    assert max(first for first, _ in spans) < min(last for _, last in spans), spans

    owners = set()
    for run in runs:
        entries = journal(run)
        [claim] = [worker_id for _, kind, _, worker_id in entries if kind == "claimed"]
        assert {worker_id for _, kind, _, worker_id in entries if kind == "step"} == {claim}
        owners.add(claim)
    assert owners == THREADS  # each thread took one run, and the journal says which
    assert list(WorkerProcess.objects.values_list("name", flat=True)) == ["w1"]  # one registry row per process
    assert worker.alive()


def test_it_recovers_every_run_of_a_killed_multi_threaded_worker_without_repeating_steps(procs, step_calls):
    runs = [start("slow_steps", {"steps": 6, "pause": 0.3}) for _ in range(3)]
    first = procs.worker("w1", MODULES, "--concurrency", "3")
    wait_until(lambda: steps_started(step_calls, runs, 2), 30, what="every run to be two steps in on w1")
    assert set(WorkflowRun.objects.values_list("lease_owner", flat=True)) == THREADS
    first.kill()
    procs.worker("w2", MODULES, "--concurrency", "3")
    wait_until(lambda: all_completed(runs), 40, what="w2 to finish every run")

    for run in runs:
        entries = journal(run)
        assert [seq for seq, *_ in entries] == list(range(1, len(entries) + 1))  # gap-free, nothing written twice
        steps = [(name, worker_id) for _, kind, name, worker_id in entries if kind == "step"]
        assert [name for name, _ in steps] == ["tick"] + [f"tick#{i}" for i in range(2, 7)]  # each journaled once
        claims = [worker_id for _, kind, _, worker_id in entries if kind == "claimed"]
        assert len(claims) == 2 and claims[0] in THREADS and claims[1].startswith("w2/"), claims
        # Steps journaled before the kill are w1's and were not run again; only the
        # step in flight when w1 died may have run twice.
        counts = step_calls.counts(run.id)
        assert set(counts) == {f"tick{i}" for i in range(6)}
        repeated = [step for step, n in counts.items() if n > 1]
        assert len(repeated) <= 1 and all(counts[s] == 2 for s in repeated), counts
        recorded_by_w1 = sum(1 for _, worker_id in steps if worker_id == claims[0])
        assert recorded_by_w1 >= 1
        assert all(counts[f"tick{i}"] == 1 for i in range(recorded_by_w1)), counts
        run.refresh_from_db()
        assert run.result == 6 and run.attempts == 2 and run.lease_owner == ""


def test_it_hands_every_run_back_and_exits_promptly_on_sigterm(procs, step_calls):
    runs = [start("slow_steps", {"steps": 40, "pause": 0.1}) for _ in range(3)]
    first = procs.worker("w1", MODULES, "--concurrency", "3")
    wait_until(lambda: steps_started(step_calls, runs, 3), 30, what="every run to be a few steps in on w1")
    signalled = time.monotonic()
    first.signal(signal.SIGTERM)
    first.popen.wait(timeout=20)
    exited_in = time.monotonic() - signalled
    assert first.popen.returncode == 0
    assert exited_in < 5.0, exited_in

    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.PENDING and run.lease_owner == ""  # handed back, not left leased
        [(_, _, _, by)] = [e for e in journal(run) if e[1] == "yielded"]
        assert by in THREADS
    assert WorkerProcess.objects.get(name="w1").stopped_at is not None

    procs.worker("w2", MODULES, "--concurrency", "3")
    wait_until(lambda: all_completed(runs), 40, what="w2 to finish every run")
    for run in runs:
        counts = step_calls.counts(run.id)
        assert len(counts) == 40 and set(counts.values()) == {1}, counts  # nothing ran twice
        assert JournalEntry.objects.filter(run=run, kind="yielded").count() == 1


def test_it_exits_within_seconds_of_sigterm_when_idle(procs):
    worker = procs.worker("w1", MODULES, "--concurrency", "4")
    wait_until(lambda: "4 threads (w1/1..w1/4)" in worker.log(), 20, what="w1 to start")
    time.sleep(1.5)  # every thread is blocked waiting for a job
    signalled = time.monotonic()
    worker.signal(signal.SIGTERM)
    worker.popen.wait(timeout=20)
    assert time.monotonic() - signalled < 4.0
    assert worker.popen.returncode == 0
    assert WorkerProcess.objects.get(name="w1").stopped_at is not None


def test_it_restarts_under_the_same_name_right_after_being_killed(procs, step_calls):
    first = procs.worker("w1", MODULES, "--concurrency", "3")
    wait_until(lambda: "3 threads (w1/1..w1/3)" in first.log(), 20, what="w1 to start")
    time.sleep(1.0)  # its threads have registered with RQ
    first.kill()
    again = procs.worker("w1", MODULES, "--concurrency", "3")  # what a supervisor does
    run = start("slow_steps", {"steps": 2})
    wait_until(lambda: all_completed([run]), 20, what="the restarted w1 to run something")
    assert again.alive()
    assert "There exists an active worker" not in again.log()
    assert {worker_id for *_, worker_id in journal(run) if worker_id} <= THREADS


def test_it_finishes_the_queue_and_exits_in_burst_mode_with_several_threads(procs, step_calls):
    runs = [start("slow_steps", {"steps": 2, "pause": 0.05}) for _ in range(6)]
    worker = procs.worker("w1", MODULES, "--concurrency", "3", "--burst", "--no-sweep")
    worker.popen.wait(timeout=30)
    assert worker.popen.returncode == 0
    assert all_completed(runs)
    claims = set(JournalEntry.objects.filter(kind="claimed").values_list("worker_id", flat=True))
    assert claims <= THREADS and len(claims) >= 2, claims


def test_it_refuses_to_start_with_a_malformed_concurrency(procs):
    worker = procs.worker("w1", MODULES, SAGAS_WORKER_CONCURRENCY="three")
    try:
        worker.popen.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("a worker with SAGAS_WORKER_CONCURRENCY=three kept running")
    assert worker.popen.returncode != 0
    assert "SAGAS_WORKER_CONCURRENCY='three' is not a whole number" in worker.log()

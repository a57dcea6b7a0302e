"""One worker process advancing several runs at once (sagas_worker --concurrency N), with real
worker processes, real signals, real PostgreSQL and Redis.

Nothing here is timed. Runs are held at a known step (``held_steps``) until the test has done
what it needs there (a SIGKILL, a SIGTERM), and concurrency is shown by runs that can only go on
once all of them are in progress at once (``meeting``). This module's workflows are loaded by
the worker processes too (``MODULES``).
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from django.db import connection
from rq import Worker

from sagas import Context, start, workflow
from sagas.models import JournalEntry, RunStatus, WorkerProcess, WorkflowRun
from sagas.replay.context import shutdown_requested
from sagas.runtime.queue import redis_connection
from tests.procs import wait_until
from tests.sagas import wf_engine  # noqa: F401  (registers the workflows in this process)
from tests.sagas.wf_engine import record_call

pytestmark = pytest.mark.django_db(transaction=True)
MODULES = "tests.sagas.wf_engine,tests.sagas.test_worker_concurrency"
THREADS = {"w1/1", "w1/2", "w1/3"}
# Only a guard against a real hang: every wait here is for an observable state.
HANG = 300.0


def _released() -> bool:
    with connection.cursor() as cur:
        cur.execute("SELECT EXISTS (SELECT 1 FROM test_step_calls WHERE run_id = 'release')")
        return cur.fetchone()[0]


def release_held_steps() -> None:
    """Lets every held step (``held_call``) go on, in any worker process."""
    with connection.cursor() as cur:
        cur.execute("INSERT INTO test_step_calls (run_id, step, pid) VALUES ('release', 'release', 0)")


def held_call(run_id: str, step: str, hold: bool) -> str:
    """``record_call``; then, if ``hold``, return only once the test released held steps or this
    worker process was asked to stop (SIGTERM): until then the run stays in this step."""
    record_call(run_id, step)
    deadline = time.monotonic() + HANG
    while hold and not shutdown_requested.is_set() and not _released():
        if time.monotonic() > deadline:
            raise RuntimeError("held step never released")
        time.sleep(0.02)
    return f"{step}-done"


@workflow("held_steps", version=1)
def held_steps(ctx: Context, spec: dict) -> int:
    """``slow_steps`` without the pauses: step ``tick{hold_at}`` is held (``held_call``)."""
    for i in range(spec["steps"]):
        ctx.step("tick", held_call, ctx.run_id, f"tick{i}", i == spec["hold_at"])
    return spec["steps"]


def meet(run_id: str, party: int) -> int:
    """Return once ``party`` runs have arrived (``meeting``), how many had; recorded as "met"."""
    deadline = time.monotonic() + HANG
    while True:
        with connection.cursor() as cur:
            cur.execute("SELECT count(DISTINCT run_id) FROM test_step_calls WHERE step = 'arrived'")
            arrived = cur.fetchone()[0]
        if arrived >= party:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {arrived} of {party} runs ever were in progress together")
        time.sleep(0.02)
    record_call(run_id, "met", 0.0, {"arrived": arrived})
    return arrived


@workflow("meeting", version=1)
def meeting(ctx: Context, spec: dict) -> int:
    """Arrive, then wait (in a step) until ``party`` runs have arrived: it completes only if
    that many runs are in progress at the same time."""
    ctx.step("arrive", record_call, ctx.run_id, "arrived")
    return ctx.step("meet", meet, ctx.run_id, spec["party"])


def statuses(runs) -> list[str]:
    return list(WorkflowRun.objects.filter(id__in=[r.id for r in runs]).values_list("status", flat=True))


def all_completed(runs) -> bool:
    found = statuses(runs)
    assert RunStatus.FAILED not in found and RunStatus.NEEDS_ATTENTION not in found, found
    return found == [RunStatus.COMPLETED] * len(runs)


def journal(run) -> list[tuple[int, str, str, str]]:
    return list(JournalEntry.objects.filter(run=run).order_by("seq").values_list("seq", "kind", "name", "worker_id"))


def steps_started(step_calls, runs, at_least: int) -> bool:
    return all(sum(step_calls.counts(r.id).values()) >= at_least for r in runs)


def rq_registration(name: str) -> dict[str, str]:
    """RQ's registration of the thread worker ``name`` (state, pid, death...), {} if none."""
    raw = redis_connection().hgetall(Worker.redis_worker_namespace_prefix + name)
    return {k.decode(): v.decode() for k, v in raw.items()}


def rq_idle(proc, *names: str) -> bool:
    """Each of these thread workers of ``proc`` registered in RQ and waiting for a job (a
    registration left by an earlier process of the same name does not count)."""
    return all(
        (r := rq_registration(name)).get("pid") == str(proc.pid) and r.get("state") == "idle" and not r.get("death")
        for name in names
    )


def test_it_advances_three_runs_at_once_in_one_process(procs, step_calls):
    runs = [start("meeting", {"party": 3}) for _ in range(3)]
    worker = procs.worker("w1", MODULES, "--concurrency", "3")
    wait_until(lambda: all_completed(runs), HANG, what="the three runs to complete")

    spans = []
    for run in runs:
        [(_, _, arrived_at)] = step_calls.rows(run.id, "arrived")
        [(_, met, met_at)] = step_calls.rows(run.id, "met")
        assert met == {"arrived": 3}
        spans.append((arrived_at, met_at))
        run.refresh_from_db()
        assert run.result == 3
    # Every run had arrived before any run went on: the three were in progress at the same
    # time (each held its step until the others arrived), not one after another.
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
    runs = [start("held_steps", {"steps": 6, "hold_at": 2}) for _ in range(3)]
    first = procs.worker("w1", MODULES, "--concurrency", "3")
    wait_until(lambda: steps_started(step_calls, runs, 3), HANG, what="every run to be held in its third step on w1")
    assert set(WorkflowRun.objects.values_list("lease_owner", flat=True)) == THREADS
    first.kill()  # each run dies inside tick2: its call happened, its result is not journaled
    release_held_steps()
    procs.worker("w2", MODULES, "--concurrency", "3")
    wait_until(lambda: all_completed(runs), HANG, what="w2 to finish every run")

    for run in runs:
        entries = journal(run)
        assert [seq for seq, *_ in entries] == list(range(1, len(entries) + 1))  # gap-free, nothing written twice
        steps = [(name, worker_id) for _, kind, name, worker_id in entries if kind == "step"]
        assert [name for name, _ in steps] == ["tick"] + [f"tick#{i}" for i in range(2, 7)]  # each journaled once
        claims = [worker_id for _, kind, _, worker_id in entries if kind == "claimed"]
        assert len(claims) == 2 and claims[0] in THREADS and claims[1].startswith("w2/"), claims
        # Steps journaled before the kill are w1's and were not run again; only the
        # step in flight when w1 died ran twice.
        counts = step_calls.counts(run.id)
        assert set(counts) == {f"tick{i}" for i in range(6)}
        repeated = [step for step, n in counts.items() if n > 1]
        assert repeated == ["tick2"] and counts["tick2"] == 2, counts
        recorded_by_w1 = sum(1 for _, worker_id in steps if worker_id == claims[0])
        assert recorded_by_w1 == 2
        assert all(counts[f"tick{i}"] == 1 for i in range(recorded_by_w1)), counts
        run.refresh_from_db()
        assert run.result == 6 and run.attempts == 2 and run.lease_owner == ""


def test_it_hands_every_run_back_at_its_next_step_boundary_on_sigterm(procs, step_calls):
    runs = [start("held_steps", {"steps": 40, "hold_at": 3}) for _ in range(3)]
    first = procs.worker("w1", MODULES, "--concurrency", "3")
    wait_until(lambda: steps_started(step_calls, runs, 4), HANG, what="every run to be held in its fourth step on w1")
    first.signal(signal.SIGTERM)  # the held steps return once the worker is stopping
    first.popen.wait(timeout=HANG)
    assert first.popen.returncode == 0

    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.PENDING and run.lease_owner == ""  # handed back, not left leased
        yielded = [e for e in journal(run) if e[1] == "yielded"]
        assert len(yielded) == 1, journal(run)
        [(_, _, _, by)] = yielded
        assert by in THREADS
        # Promptly: the step in flight finished and was kept, and not one more step ran.
        assert step_calls.counts(run.id) == {f"tick{i}": 1 for i in range(4)}
        assert [name for _, kind, name, _ in journal(run) if kind == "step"] == ["tick", "tick#2", "tick#3", "tick#4"]
    assert WorkerProcess.objects.get(name="w1").stopped_at is not None

    procs.worker("w2", MODULES, "--concurrency", "3")
    wait_until(lambda: all_completed(runs), HANG, what="w2 to finish every run")
    for run in runs:
        counts = step_calls.counts(run.id)
        assert len(counts) == 40 and set(counts.values()) == {1}, counts  # nothing ran twice
        assert JournalEntry.objects.filter(run=run, kind="yielded").count() == 1


def test_it_exits_on_sigterm_when_idle_without_waiting_for_a_job(procs):
    worker = procs.worker("w1", MODULES, "--concurrency", "4")
    names = [f"w1/{i}" for i in range(1, 5)]
    wait_until(lambda: rq_idle(worker, *names) or not worker.alive(), HANG,
               what="every thread of w1 to wait for a job")
    assert worker.alive(), worker.log()
    worker.signal(signal.SIGTERM)
    worker.popen.wait(timeout=HANG)  # no job comes to wake a thread: each leaves its idle wait itself
    assert worker.popen.returncode == 0
    assert WorkerProcess.objects.get(name="w1").stopped_at is not None
    # each thread left RQ's loop by the stop and registered its death
    assert all(rq_registration(name).get("death") for name in names), [rq_registration(n) for n in names]
    assert "Traceback" not in worker.log(), worker.log()


def test_it_restarts_under_the_same_name_right_after_being_killed(procs, step_calls):
    first = procs.worker("w1", MODULES, "--concurrency", "3")
    names = sorted(THREADS)
    wait_until(lambda: rq_idle(first, *names) or not first.alive(), HANG,
               what="w1's threads to register with RQ")
    assert first.alive(), first.log()
    first.kill()
    # killed: its registrations are left behind in RQ, alive as far as RQ knows
    assert all(rq_registration(name).get("pid") == str(first.pid) and not rq_registration(name).get("death")
               for name in names)
    again = procs.worker("w1", MODULES, "--concurrency", "3")  # what a supervisor does
    run = start("slow_steps", {"steps": 2})
    wait_until(lambda: all_completed([run]), HANG, what="the restarted w1 to run something")
    assert again.alive()
    assert "There exists an active worker" not in again.log()
    assert {worker_id for *_, worker_id in journal(run) if worker_id} <= THREADS


def test_it_finishes_the_queue_and_exits_in_burst_mode_with_several_threads(procs, step_calls):
    # The first run to arrive can only go on once another run is in progress: a second thread took one.
    runs = [start("meeting", {"party": 2}) for _ in range(6)]
    worker = procs.worker("w1", MODULES, "--concurrency", "3", "--burst", "--no-sweep")
    worker.popen.wait(timeout=HANG)
    assert worker.popen.returncode == 0
    assert all_completed(runs)
    claims = set(JournalEntry.objects.filter(kind="claimed").values_list("worker_id", flat=True))
    assert claims <= THREADS and len(claims) >= 2, claims


def test_it_refuses_to_start_with_a_malformed_concurrency(procs):
    worker = procs.worker("w1", MODULES, SAGAS_WORKER_CONCURRENCY="three")
    try:
        worker.popen.wait(timeout=HANG)
    except subprocess.TimeoutExpired:
        pytest.fail("a worker with SAGAS_WORKER_CONCURRENCY=three kept running")
    assert worker.popen.returncode != 0
    assert "SAGAS_WORKER_CONCURRENCY='three' is not a whole number" in worker.log()

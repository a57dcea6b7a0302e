"""What sagas.runtime.rqworker relies on in RQ beyond its documented use, pinned so that an RQ
upgrade that changes it fails here, by name, rather than as a worker that hangs on
SIGTERM or cannot restart (see the module docstring of sagas.runtime.rqworker)."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid

import pytest
from rq import SimpleWorker
from rq.job import Job
from rq.suspension import resume, suspend

from sagas.runtime.queue import get_queue, redis_connection
from sagas.runtime.rqworker import ThreadWorker
from tests.procs import wait_until


def _queue():
    return get_queue(f"contract:{uuid.uuid4().hex[:8]}")


def _in_thread(worker: ThreadWorker, **work_args) -> tuple[threading.Thread, dict]:
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["worked"] = worker.work(with_scheduler=False, logging_level="WARNING", **work_args)
        except BaseException as exc:  # noqa: BLE001 (the test reports it)
            outcome["error"] = exc

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread, outcome


def _state(worker: ThreadWorker) -> str | None:
    state = redis_connection().hget(worker.key, "state")
    return state.decode() if state else None


def test_it_runs_a_job_in_a_thread_because_work_installs_signal_handlers_only_in_the_overridden_hook():
    queue = _queue()
    job = queue.enqueue("builtins.len", "four", result_ttl=60)
    worker = ThreadWorker([queue], connection=redis_connection(), name=f"contract-{uuid.uuid4().hex[:8]}")

    thread, outcome = _in_thread(worker, burst=True)
    thread.join(timeout=60)

    assert not thread.is_alive()
    assert "error" not in outcome, outcome  # RQ's signal.signal outside the main thread: ValueError
    assert outcome["worked"] is True
    assert Job.fetch(job.id, connection=redis_connection()).return_value() == 4


def test_it_stops_an_idle_thread_worker_at_the_heartbeat_rq_sends_before_each_dequeue_retry():
    worker = ThreadWorker([_queue()], connection=redis_connection(), name=f"contract-{uuid.uuid4().hex[:8]}")
    thread, outcome = _in_thread(worker)
    wait_until(lambda: _state(worker) == "idle", 30, what="the worker to wait for jobs")

    worker.stop()
    thread.join(timeout=60)  # one dequeue blocks POLL_SECONDS; without a beat per retry it never ends

    assert not thread.is_alive(), "a stopped idle worker kept waiting for jobs"
    assert outcome == {"worked": False}
    assert redis_connection().hexists(worker.key, "death")  # it left through RQ's teardown


def test_it_stops_a_suspended_thread_worker_because_rq_beats_while_it_waits_out_a_suspension():
    worker = ThreadWorker([_queue()], connection=redis_connection(), name=f"contract-{uuid.uuid4().hex[:8]}")
    suspend(redis_connection())
    try:
        thread, outcome = _in_thread(worker)
        wait_until(lambda: _state(worker) == "suspended", 30, what="the worker to be suspended")

        worker.stop()
        thread.join(timeout=60)
    finally:
        resume(redis_connection())

    assert not thread.is_alive(), "a stopped worker kept waiting out `rq suspend`"
    assert outcome == {"worked": False}


def test_it_takes_over_a_dead_process_registration_that_rq_register_birth_refuses():
    queue = _queue()
    name = f"contract-{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: no process has this pid any more
    crashed = SimpleWorker([queue], connection=redis_connection(), name=name)
    crashed.pid = child.pid
    crashed.register_birth()  # what a SIGKILLed worker leaves: a birth, no death

    with pytest.raises(ValueError, match="active worker named"):
        SimpleWorker([queue], connection=redis_connection(), name=name).register_birth()

    restarted = ThreadWorker([queue], connection=redis_connection(), name=name)
    thread, outcome = _in_thread(restarted, burst=True)
    thread.join(timeout=60)
    assert "error" not in outcome, outcome
    assert int(redis_connection().hget(restarted.key, "pid")) == os.getpid()

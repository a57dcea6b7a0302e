"""The engine's worker: an RQ ``SimpleWorker`` plus a background sweeper.

Why ``SimpleWorker`` (no fork per job): the process that dequeues is the process
that runs the workflow code, so killing it kills the run's execution for
certain (RQ's forking worker leaves a child that survives a ``kill -9`` of its
parent). Recovery never depends on RQ noticing a dead worker: the run's lease
expires and the sweeper re-enqueues it. Forking also costs several
milliseconds per job, which a 20-step run cannot afford.

On SIGTERM/SIGINT the worker stops taking jobs, and a run in progress is handed
back (PENDING, re-enqueued) at its next step boundary instead of finishing.

Concurrency: ``WorkerPool`` runs N ``ThreadWorker``s in one process, one thread
each, so a process advances N runs at once (a run mostly waits: on PostgreSQL
commits, and in real workflows on model calls). Each thread has its own RQ
worker name (``<name>/<i>``), its own identity in leases and the journal, and
its own Django database connection. The process keeps one entry in the worker
registry.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from datetime import datetime
from types import FrameType

import redis
from django.conf import settings
from django.db import connection
from redis import Redis
from redis.client import Pipeline
from rq import Queue, SimpleWorker
from rq.exceptions import InvalidJobOperation, NoSuchJobError, StopRequested
from rq.job import Job
from rq.worker import WorkerStatus
from rq.timeouts import TimerDeathPenalty

from config.storage import (
    OUTAGES,
    REDIS,
    is_redis_error,
    is_storage_error,
    note_failure,
    note_success,
    wait_for_redis,
)
from sagas import recovery, services
from sagas.context import shutdown_requested
from sagas.engine import set_thread_worker_id

log = logging.getLogger("sagas.worker")

_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)


class RQOutageFilter(logging.Filter):
    """RQ logs every failed reconnection (an error line per thread every second or two)
    and a traceback when its loop gives up. While Redis is away we want one line when
    the outage starts and one when it ends: those come from ``config.storage.OUTAGES``."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if "could not connect to Redis instance" in message or "Redis connection timeout" in message:
            OUTAGES.down(REDIS, "connection refused or timed out", doing="waiting for jobs")
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and is_redis_error(exc):
            OUTAGES.down(REDIS, exc, doing="waiting for jobs")
            return False
        if isinstance(exc, (InvalidJobOperation, NoSuchJobError)):
            # A Redis restart or flush took the job's hash while it ran: its work is done
            # and journaled in PostgreSQL; only RQ's bookkeeping of it is gone. One line.
            record.msg, record.args, record.exc_info, record.exc_text = (
                "RQ lost a job's bookkeeping (Redis restarted or was flushed while it ran): %s", (exc,), None, None
            )
        return True


def install_rq_outage_filter() -> None:
    rq_log = logging.getLogger("rq.worker")
    if not any(isinstance(f, RQOutageFilter) for f in rq_log.filters):
        rq_log.addFilter(RQOutageFilter())


class RideOutRedisOutages:
    """Mixin for RQ workers: a Redis outage pauses the worker instead of ending it.

    RQ retries a failed dequeue, but any other Redis error in its loop (a heartbeat,
    a job's bookkeeping, its registration) makes ``work()`` log a traceback and
    return, and the process would exit with nobody to restart it. Here every such
    error is noticed on its way out, and ``work()`` waits for Redis (backing off) and
    starts RQ's loop again. The job that was running when Redis went away has done
    its work in PostgreSQL; only its RQ bookkeeping is lost, which nothing reads.
    RQ's own reconnection waits are capped at 2 s, so a worker resumes within about
    that of Redis coming back.
    """

    max_connection_wait_time = 2.0
    _redis_failed: BaseException | None = None

    def _noting_redis(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except _REDIS_ERRORS as exc:
            self._redis_failed = exc
            raise

    def bootstrap(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._noting_redis(super().bootstrap, *args, **kwargs)

    def teardown(self):  # type: ignore[no-untyped-def]
        return self._noting_redis(super().teardown)

    def check_for_suspension(self, burst):  # type: ignore[no-untyped-def]
        return self._noting_redis(super().check_for_suspension, burst)

    def run_maintenance_tasks(self):  # type: ignore[no-untyped-def]
        return self._noting_redis(super().run_maintenance_tasks)

    def execute_job(self, job, queue):  # type: ignore[no-untyped-def]
        return self._noting_redis(super().execute_job, job, queue)

    def heartbeat(self, timeout=None, pipeline=None):  # type: ignore[no-untyped-def]
        # RQ beats before every (re)try of its blocking dequeue, so this is where a worker
        # idling in that loop first hears that Redis is back, or that it was asked to stop.
        self._raise_if_stopping(pipeline)
        result = self._noting_redis(super().heartbeat, timeout, pipeline)
        if pipeline is None:
            self._redis_answered()
        return result

    def dequeue_job_and_maintain_ttl(self, timeout, max_idle_time=None):  # type: ignore[no-untyped-def]
        result = self._noting_redis(super().dequeue_job_and_maintain_ttl, timeout, max_idle_time)
        self._redis_answered()
        return result

    def _redis_answered(self) -> None:
        OUTAGES.up(REDIS)
        if OUTAGES.count.get(REDIS, 0) != self._outages_seen:
            self._outages_seen = OUTAGES.count.get(REDIS, 0)
            self._register_again_if_lost()

    _outages_seen = 0

    def _register_again_if_lost(self) -> None:
        """After an outage Redis may have come back empty (a restart without persistence, a
        flush): register this worker again so ``rq info`` and a restart under its name
        see a whole registration, not the lone heartbeat field RQ's heartbeat re-created."""
        try:
            if not self.connection.hexists(self.key, "birth"):
                self.connection.delete(self.key)
                self.register_birth()
        except _REDIS_ERRORS as exc:
            OUTAGES.down(REDIS, exc, doing="registering the worker again")

    def work(self, burst: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        install_rq_outage_filter()
        while True:
            self._redis_failed = None
            try:
                worked = super().work(burst=burst, **kwargs)
            except _REDIS_ERRORS as exc:  # raised by bootstrap or teardown
                self._redis_failed = exc
                worked = False
            failed = self._redis_failed
            # RQ sets _stop_requested only when asked to stop mid-job (otherwise it raises
            # StopRequested out of its loop), so a stop is also read from shutdown_requested:
            # a teardown that failed on a dead Redis connection must not look like an outage
            # to wait out, or the worker ignores its SIGTERM.
            if failed is None or burst or self._stopping():
                return worked
            OUTAGES.down(REDIS, failed, doing="waiting for jobs")
            try:
                self.unsubscribe()
            except Exception:  # its thread dies with the connection anyway
                pass
            while not self._stopping():
                if wait_for_redis(self.connection, until=time.monotonic() + 1.0, doing="waiting for jobs"):
                    break
            if self._stopping():
                return worked

    def _stopping(self) -> bool:
        return bool(self._stop_requested) or shutdown_requested.is_set()

    def _raise_if_stopping(self, pipeline: Pipeline | None = None) -> None:
        """RQ's dequeue retries a dead Redis forever without looking at its stop flag; a
        worker asked to stop while idle leaves that loop here instead of waiting for Redis."""
        if pipeline is None and self._stopping() and self.get_state() != WorkerStatus.BUSY:
            raise StopRequested()


class TakeOverStaleName:
    """Mixin for RQ workers: restartable under the same name right after a crash."""

    def register_birth(self) -> None:
        """Take over the RQ registration of a dead predecessor of the same name.

        A process killed without warning (SIGKILL, a second SIGTERM, a crash) leaves
        its RQ registration for ``worker_ttl`` + 60 s, and RQ refuses to start a worker
        of the same name meanwhile: a supervisor restarting ``--name w1`` would fail
        for minutes. Names are unique per process, so a registration under this name
        that no process on this host owns any more is stale and is dropped.
        """
        hostname, pid, death = self.connection.hmget(self.key, "hostname", "pid", "death")
        if death is None and (hostname is None or pid is None) and self.connection.exists(self.key):
            # Only a heartbeat's fields: Redis restarted or was flushed under the previous
            # process of this name, and its heartbeat re-created the key without a birth.
            # Nothing says who owns it; RQ would refuse this name until the key expires.
            log.info("worker %s: dropping a partial RQ registration (Redis lost the rest)", self.name)
            self.connection.delete(self.key)
        elif hostname is not None and death is None and pid is not None:
            stale_pid = int(pid)
            if hostname.decode() == socket.gethostname() and (stale_pid == os.getpid() or not _alive(stale_pid)):
                # Our own pid: this process's earlier round of work(), whose teardown a
                # Redis outage cut short (RideOutRedisOutages starts it again).
                if stale_pid != os.getpid():
                    log.info("worker %s: dropping the RQ registration left by dead process %d", self.name, stale_pid)
                self.connection.delete(self.key)
        super().register_birth()


class SagaWorker(RideOutRedisOutages, TakeOverStaleName, SimpleWorker):
    def request_stop(self, signum, frame):  # type: ignore[no-untyped-def]
        shutdown_requested.set()
        return super().request_stop(signum, frame)


class BackgroundThread(threading.Thread):
    """Every ``SAGAS_SWEEP_INTERVAL`` seconds: beat in the worker registry, then (unless
    disabled) sweep, one process at a time by advisory lock."""

    def __init__(self, *, name: str, started_at: datetime, sweep: bool) -> None:
        super().__init__(name="sagas-background", daemon=True)
        self.worker_name, self.started_at, self.sweep = name, started_at, sweep
        self.interval = settings.SAGAS_SWEEP_INTERVAL
        self.stop_event = threading.Event()

    def beat(self) -> None:
        services.worker_beat(name=self.worker_name, hostname=socket.gethostname(), pid=os.getpid(),
                             started_at=self.started_at)

    def run(self) -> None:
        try:
            while not self.stop_event.wait(self.interval):
                try:
                    self.beat()
                    note_success()  # "outage over" even when no job comes to say so
                    if self.sweep:
                        report = recovery.try_sweep_locked()
                        if report is not None and report.total:
                            log.info("sweep: %s", report)
                except Exception as exc:
                    if is_storage_error(exc):  # one line per outage, not a traceback per pass
                        note_failure(exc, doing="sweeping")
                    else:
                        log.exception("background pass failed; retrying next interval")
                    connection.close()
        finally:
            connection.close()


# Threads per process: each holds a database connection, plus one per run in
# progress for its lease heartbeat.
MAX_CONCURRENCY = 64
# How long a thread worker blocks in one dequeue: the bound on how long an idle
# thread takes to notice that it was asked to stop.
POLL_SECONDS = 1
# A thread worker's bare heartbeats (not those RQ batches with a job's bookkeeping)
# are at least this far apart.
HEARTBEAT_MIN_INTERVAL = 1.0


class ThreadWorker(RideOutRedisOutages, TakeOverStaleName, SimpleWorker):
    """An RQ worker that runs in a thread other than the main one.

    What differs from ``SagaWorker`` because it is not in the main thread:

    * it installs no signal handlers (``signal.signal`` works only in the main
      thread): the process's ``WorkerPool`` handles SIGTERM/SIGINT and calls
      ``stop()``;
    * while it waits for a job it wakes every ``POLL_SECONDS`` to see whether it
      was stopped, so an idle worker leaves its loop within about that long;
    * a job's timeout, if it has one, is enforced by a timer thread, not SIGALRM
      (``advance`` jobs have none: a hung run is the lease's business).

    ``stop()`` is a warm stop: a job in progress is finished first (a run hands
    itself back at its next step boundary once ``shutdown_requested`` is set).

    It also skips Redis writes that carry no information, about 6 of the ~29
    round trips RQ makes per job: a bare heartbeat less than
    ``HEARTBEAT_MIN_INTERVAL`` after the previous one (RQ calls it three to five
    times per job; the worker key it extends lives ``worker_ttl`` + 60 s), and a
    state write that repeats the state already written. What ``rq info`` shows
    is at most that interval stale; nothing in the engine reads it.
    """

    death_penalty_class = TimerDeathPenalty
    _last_beat = float("-inf")

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        self._raise_if_stopping(pipeline)
        if timeout is None and pipeline is None:
            now = time.monotonic()
            if now - self._last_beat < HEARTBEAT_MIN_INTERVAL:
                return
            self._last_beat = now
        super().heartbeat(timeout, pipeline)

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is None and state == self._state:
            return
        super().set_state(state, pipeline)

    @property
    def dequeue_timeout(self) -> int:
        return POLL_SECONDS

    def _install_signal_handlers(self) -> None:
        pass

    def request_stop(self, signum, frame):  # type: ignore[no-untyped-def]
        self.stop()

    def stop(self) -> None:
        self._stop_requested = True

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        if timeout is None:  # burst: one non-blocking look at the queues
            return super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        while not self._stop_requested:
            result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time=timeout)
            if result is not None:
                return result
        raise StopRequested()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class WorkerThread(threading.Thread):
    """Runs one ``ThreadWorker`` under its own identity and closes its DB connection at the end."""

    def __init__(self, worker: ThreadWorker, *, burst: bool) -> None:
        super().__init__(name=f"sagas-worker {worker.name}", daemon=True)
        self.worker, self.burst = worker, burst
        self.failed = False

    def run(self) -> None:
        set_thread_worker_id(self.worker.name)
        try:
            self.worker.work(burst=self.burst, with_scheduler=False, logging_level="WARNING")
        except BaseException:
            self.failed = True
            log.exception("worker %s stopped on an error", self.worker.name)
        finally:
            connection.close()


class WorkerPool:
    """N ``ThreadWorker``s in this process, named ``<name>/1`` .. ``<name>/N``.

    Runs in the main thread, which handles SIGTERM and SIGINT: the first one sets
    ``shutdown_requested`` (runs in progress are handed back at their next step
    boundary) and stops every worker after its current job; a second one exits at
    once (what a SIGKILL would do: leases expire and another worker recovers).

    ``run()`` returns when every thread has ended: in burst mode once the queues
    are empty, otherwise once stopped. It returns False if a thread ended on its
    own (an error RQ gave up on); the other threads are then stopped too, so the
    process exits and its supervisor can restart it, as with one worker.
    """

    def __init__(self, *, name: str, queue_names: list[str], connection: Redis, concurrency: int, burst: bool) -> None:
        self.name, self.burst = name, burst
        self.workers = [
            # Queue names, not shared Queue objects: each worker builds its own with
            # its death-penalty class.
            ThreadWorker(list(queue_names), connection=connection, name=f"{name}/{i}")
            for i in range(1, concurrency + 1)
        ]
        self.threads = [WorkerThread(w, burst=burst) for w in self.workers]
        self.stopping = False
        self._signals = 0

    def stop(self) -> None:
        self.stopping = True
        shutdown_requested.set()
        for worker in self.workers:
            worker.stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("worker %s: second %s, exiting now", self.name, signal.Signals(signum).name)
            raise SystemExit(1)
        log.info("worker %s: %s, handing runs back and stopping", self.name, signal.Signals(signum).name)
        self.stop()

    def run(self) -> bool:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        clean = True
        try:
            for thread in self.threads:
                thread.start()
            while alive := [t for t in self.threads if t.is_alive()]:
                if len(alive) < len(self.threads) and not self.burst and not self.stopping:
                    ended = [t.worker.name for t in self.threads if not t.is_alive()]
                    log.error("worker %s ended on its own; stopping the other threads", ", ".join(ended))
                    clean = False
                    self.stop()
                alive[0].join(timeout=0.2)
            return clean and not any(t.failed for t in self.threads)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

"""The engine's RQ workers: ``SagaWorker`` (the main thread's) and ``ThreadWorker`` (one of
a ``WorkerPool``'s threads, see ``sagas.runtime.worker``), both ``SimpleWorker``s.

Why ``SimpleWorker`` (no fork per job): the process that dequeues is the process
that runs the workflow code, so killing it kills the run's execution for
certain (RQ's forking worker leaves a child that survives a ``kill -9`` of its
parent). Recovery never depends on RQ noticing a dead worker: the run's lease
expires and the sweeper re-enqueues it. Forking also costs several
milliseconds per job, which a 20-step run cannot afford.

What RQ is relied on for, and how (rq 2.x; ``tests/sagas/test_rq_contract.py``
fails if an upgrade changes any of it):

* only RQ's public methods are overridden and called (``work``, ``bootstrap``,
  ``teardown``, ``heartbeat``, ``dequeue_job_and_maintain_ttl``, ``execute_job``,
  ``register_birth``, ``set_state``/``get_state``, ``dequeue_timeout``,
  ``check_for_suspension``, ``handle_job_failure``, ``increment_*``...), except
  ``_install_signal_handlers``: RQ has no public switch for the signal handlers
  ``work()`` installs, and ``signal.signal`` fails outside the main thread;
* a stop is noticed at the heartbeat RQ sends before each (re)try of its
  blocking dequeue: a worker blocks ``POLL_SECONDS`` at a time, so it
  leaves an idle loop within about that long, and any worker leaves RQ's
  retries of a dead Redis there;
* ``register_birth`` refuses a name whose registration has no death date; a
  crashed predecessor's registration is dropped just before it.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis
from redis.client import Pipeline
from rq import SimpleWorker
from rq.exceptions import InvalidJobOperation, NoSuchJobError, StopRequested
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import TimerDeathPenalty
from rq.worker import WorkerStatus

from core.storage import OUTAGES, REDIS, is_redis_error, wait_for_redis
from sagas.replay.context import shutdown_requested
from sagas.runtime import dispatch, jobs
from sagas.runtime.queue import ADVANCE_JOB, marker_key

log = logging.getLogger("sagas.runtime.worker")

_REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError)

# How long a thread worker blocks in one dequeue: the bound on how long an idle
# thread takes to notice that it was asked to stop.
POLL_SECONDS = 1
# A thread worker's bare heartbeats (not those RQ batches with a job's bookkeeping)
# are at least this far apart.
HEARTBEAT_MIN_INTERVAL = 1.0

_T = TypeVar("_T")

# The mixins below are mixed into SimpleWorker and call its methods through super(): to the
# type checker each one is a SimpleWorker, at run time a plain class before it in the MRO.
if TYPE_CHECKING:
    _WorkerMixin = SimpleWorker
else:
    _WorkerMixin = object


class RQOutageFilter(logging.Filter):
    """RQ logs every failed reconnection (an error line per thread every second or two)
    and a traceback when its loop gives up. While Redis is away we want one line when
    the outage starts and one when it ends: those come from ``core.storage.OUTAGES``."""

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


class RideOutRedisOutages(_WorkerMixin):
    """Mixin for RQ workers: a Redis outage pauses the worker instead of ending it.

    RQ retries a failed dequeue, but any other Redis error in its loop (a heartbeat,
    a job's bookkeeping, its registration) makes ``work()`` log a traceback and
    return, and the process would exit with nobody to restart it. Here every such
    error is noticed on its way out, and ``work()`` waits for Redis (backing off) and
    starts RQ's loop again. The job that was running when Redis went away has done
    its work in PostgreSQL; only its RQ bookkeeping is lost, which nothing reads.
    RQ's own reconnection waits are capped at 2 s, so a worker resumes within about
    that of Redis coming back.

    ``stop()`` asks the worker to stop after its current job, from any thread; so
    does ``shutdown_requested`` (set on SIGTERM/SIGINT).
    """

    max_connection_wait_time = 2.0
    _redis_failed: BaseException | None = None
    _outages_seen = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_requested = threading.Event()

    def stop(self) -> None:
        """A warm stop: a job in progress is finished first (a run hands itself back at
        its next step boundary once ``shutdown_requested`` is set)."""
        self.stop_requested.set()

    def _noting_redis(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        try:
            return fn(*args, **kwargs)
        except _REDIS_ERRORS as exc:
            self._redis_failed = exc
            raise

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        self._noting_redis(super().bootstrap, *args, **kwargs)

    def teardown(self) -> None:
        self._noting_redis(super().teardown)

    def check_for_suspension(self, burst: bool) -> None:
        self._noting_redis(super().check_for_suspension, burst)

    def run_maintenance_tasks(self) -> None:
        self._noting_redis(super().run_maintenance_tasks)

    def execute_job(self, job: Job, queue: Queue) -> None:
        self._noting_redis(super().execute_job, job, queue)

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        # RQ beats before every (re)try of its blocking dequeue, so this is where a worker
        # idling in that loop first hears that Redis is back, or that it was asked to stop.
        self._raise_if_stopping(pipeline)
        self._noting_redis(super().heartbeat, timeout, pipeline)
        if pipeline is None:
            self._redis_answered()

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        # Wrapped only to note a Redis error RQ's retries do not catch (a timeout).
        result = self._noting_redis(super().dequeue_job_and_maintain_ttl, timeout, max_idle_time)
        self._redis_answered()
        return result

    def _redis_answered(self) -> None:
        OUTAGES.up(REDIS)
        if OUTAGES.count.get(REDIS, 0) != self._outages_seen:
            self._outages_seen = OUTAGES.count.get(REDIS, 0)
            self._register_again_if_lost()

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

    def work(self, burst: bool = False, *args: Any, **kwargs: Any) -> bool:
        install_rq_outage_filter()
        while True:
            self._redis_failed = None
            try:
                worked = super().work(burst, *args, **kwargs)
            except _REDIS_ERRORS as exc:  # raised by bootstrap or teardown
                self._redis_failed = exc
                worked = False
            failed = self._redis_failed
            # A teardown that failed on a dead Redis connection after a stop must not look
            # like an outage to wait out, or the worker ignores its SIGTERM.
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
        return self.stop_requested.is_set() or shutdown_requested.is_set()

    def _raise_if_stopping(self, pipeline: Pipeline | None = None) -> None:
        """Leave RQ's loop for a stop: between jobs and while idle (RQ's dequeue retries a
        dead Redis forever without looking at any stop flag), never in the middle of a
        job's bookkeeping; and from RQ's wait while workers are suspended (``rq suspend``),
        whose checks beat through a pipeline."""
        state = self.get_state()
        if not self._stopping() or state == WorkerStatus.BUSY:
            return
        if pipeline is None or state == WorkerStatus.SUSPENDED:
            raise StopRequested()


class QuietBookkeeping(_WorkerMixin):
    """Mixin for RQ workers: skips Redis writes that carry no information.

    * a bare heartbeat (not one RQ batches with a job's bookkeeping) less than
      ``HEARTBEAT_MIN_INTERVAL`` after the previous one; RQ sends one before and after each
      dequeue and after each job, each three commands and three round trips, to extend a
      worker key that lives ``worker_ttl`` + 60 s. The beats that are sent go in one round trip;
    * a state write that repeats the state already written;
    * a check for ``rq suspend`` less than ``HEARTBEAT_MIN_INTERVAL`` after the previous one
      (RQ checks before every job): a suspension is noticed within that interval.

    What ``rq info`` shows is at most that interval stale; nothing in the engine reads it.
    """

    _last_beat = float("-inf")
    _last_suspension_check = float("-inf")

    def heartbeat(self, timeout: int | None = None, pipeline: Pipeline | None = None) -> None:
        if timeout is None and pipeline is None:
            now = time.monotonic()
            if now - self._last_beat < HEARTBEAT_MIN_INTERVAL:
                return
            self._last_beat = now
            with self.connection.pipeline(transaction=False) as beat:
                super().heartbeat(timeout, beat)
                beat.execute()
            return
        super().heartbeat(timeout, pipeline)

    def set_state(self, state: str, pipeline: Pipeline | None = None) -> None:
        if pipeline is None and state == self.get_state():
            return
        super().set_state(state, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        now = time.monotonic()
        if now - self._last_suspension_check < HEARTBEAT_MIN_INTERVAL:
            return
        self._last_suspension_check = now
        super().check_for_suspension(burst)


class LeanAdvanceJobs(_WorkerMixin):
    """Mixin for RQ workers: an ``advance`` job runs without RQ's per-job bookkeeping.

    RQ stays the transport: the job is enqueued, listed and dequeued by RQ as any other. But
    around each job RQ keeps an execution record, the started-job registry, the job's status,
    heartbeats, dependents and its result: 28 Redis round trips and about 4 ms of the worker's
    CPU per job (measured over 500 jobs that did nothing), as much as a 20-step run's own work.
    An ``advance`` job needs none of it: PostgreSQL holds the truth, the run's lease (not RQ)
    notices a dead worker, and the job has no result (``result_ttl=0``). So here it costs two
    round trips around ``sagas.runtime.jobs.advance_now``: one before (clear the run's wake-up marker,
    state busy) and one after (delete the job, state idle, the worker's counters).

    What is given up, for these jobs only: the job is not in the started-job registry or its
    executions while it runs (the dashboard shows the worker busy, not the job), and has no
    status updates. A job that raises goes through RQ's failure handling as before (failed-job
    registry, ``failure_ttl``). Every other job gets RQ's whole lifecycle.
    """

    def _clear_taken(self, job: Job, queue: Queue, run_id: str) -> None:
        dispatch.was_taken(run_id)  # forget it: a later job for the run is a new wake-up
        with self.connection.pipeline(transaction=False) as done:
            done.delete(marker_key(run_id))
            done.delete(job.key)
            done.lrem(queue.intermediate_queue_key, 1, job.id)
            try:
                done.execute()
            except _REDIS_ERRORS as exc:
                log.warning("could not clear the job of %s taken by the fast path: %s", run_id, exc)

    def execute_job(self, job: Job, queue: Queue) -> None:
        if job.func_name != ADVANCE_JOB or len(job.args) != 1 or job.kwargs:
            super().execute_job(job, queue)
            return
        run_id = str(job.args[0])
        if dispatch.was_taken(run_id, forget=False):  # the fast path had it: clear the job away, nothing else
            self._clear_taken(job, queue, run_id)
            return
        job.started_at = datetime.now(UTC)
        with self.connection.pipeline(transaction=False) as before:
            before.delete(marker_key(run_id))
            self.set_state(WorkerStatus.BUSY, pipeline=before)
            try:
                before.execute()
            except _REDIS_ERRORS as exc:  # the run is advanced all the same; the marker lapses
                log.warning("could not clear queue marker for %s: %s", run_id, exc)
        try:
            with _slot():  # the process's concurrency, shared with the fast dispatch path
                # The fast path may have taken the run while this thread waited for the slot.
                if not dispatch.was_taken(run_id):
                    jobs.advance_now(run_id)
        except Exception:
            job.ended_at = datetime.now(UTC)
            exc_info = sys.exc_info()
            self.handle_exception(job, *exc_info)
            self.handle_job_failure(
                job, queue, started_job_registry=queue.started_job_registry,
                exc_string="".join(traceback.format_exception(*exc_info)),
            )
            self.set_state(WorkerStatus.IDLE)
            return
        job.ended_at = datetime.now(UTC)
        with self.connection.pipeline(transaction=False) as after:
            after.delete(job.key)  # result_ttl=0: RQ deletes it too
            after.lrem(queue.intermediate_queue_key, 1, job.id)  # RQ's one-queue dequeue parks it there
            self.increment_successful_job_count(pipeline=after)
            self.increment_total_working_time(job.ended_at - job.started_at, after)
            self.set_state(WorkerStatus.IDLE, pipeline=after)
            after.execute()


@contextmanager
def _slot() -> Iterator[None]:
    """Hold one of the process's slots (``sagas.runtime.dispatch.slots``) while a run advances."""
    held = dispatch.slots
    if held is None:
        yield
        return
    held.take()
    try:
        yield
    finally:
        held.give_back()


class TakeOverStaleName(_WorkerMixin):
    """Mixin for RQ workers: restartable under the same name right after a crash."""

    def register_birth(self) -> None:
        """Take over the RQ registration of a dead predecessor of the same name.

        A process killed without warning (SIGKILL, a second SIGTERM, a crash) leaves
        its RQ registration for ``worker_ttl`` + 60 s, and RQ refuses to start a worker
        of the same name meanwhile: a supervisor restarting ``--name w1`` would fail
        for minutes. Names are unique per process, so a registration under this name
        that no process on this host owns any more is stale and is dropped.
        """
        # redis-py types its commands for the sync and asyncio clients at once; this one is sync.
        fields = cast("list[bytes | None]", self.connection.hmget(self.key, ["hostname", "pid", "death"]))
        hostname, pid, death = fields
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


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


class SagaWorker(RideOutRedisOutages, QuietBookkeeping, LeanAdvanceJobs, TakeOverStaleName, SimpleWorker):
    """The worker of a process that runs one: in the main thread, with RQ's signal
    handling (a first SIGTERM/SIGINT is a warm stop, a second a cold one)."""

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        shutdown_requested.set()
        super().request_stop(signum, frame)

    @property
    def dequeue_timeout(self) -> int:
        """``POLL_SECONDS``, as a thread worker's, not RQ's 405 s: Redis hands the next job to
        the client blocked longest, even one whose host has just lost the network, and that job
        is gone with it (its marker then holds the run for ``MARKER_TTL_SECONDS``). A cut-off
        worker stops being such a client within ``POLL_SECONDS``."""
        return POLL_SECONDS


class ThreadWorker(RideOutRedisOutages, QuietBookkeeping, LeanAdvanceJobs, TakeOverStaleName, SimpleWorker):
    """An RQ worker that runs in a thread other than the main one.

    What differs from ``SagaWorker`` because it is not in the main thread:

    * it installs no signal handlers (``signal.signal`` works only in the main
      thread): the process's ``WorkerPool`` handles SIGTERM/SIGINT and calls
      ``stop()``;
    * while it waits for a job it wakes every ``POLL_SECONDS`` to see whether it
      was stopped, so an idle worker leaves its loop within about that long;
    * a job's timeout, if it has one, is enforced by a timer thread, not SIGALRM
      (``advance`` jobs have none: a hung run is the lease's business).
    """

    death_penalty_class = TimerDeathPenalty

    @property
    def dequeue_timeout(self) -> int:
        return POLL_SECONDS

    def _install_signal_handlers(self) -> None:
        # Private, and overridden on purpose: RQ's work() installs SIGINT/SIGTERM handlers
        # through this method and offers no public way to skip it, while signal.signal
        # raises ValueError outside the main thread. Pinned by tests/sagas/test_rq_contract.py.
        pass

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop()

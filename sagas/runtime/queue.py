"""Redis is a wake-up transport, never the truth.

Runs are routed by code version: each definition hash has its own RQ queue
(``<SAGAS_QUEUE>:<hash prefix>``) and a worker listens only on the queues of the
definitions it has registered. During a rolling deploy, old runs therefore go
to workers that still have their code, never to one that would refuse them.
A COMPENSATING run needs no workflow code, only connectors, so it goes to one
queue every worker reads (``<SAGAS_QUEUE>:compensation``): undoing a run's
effects never waits for its old code to be deployed again.

``enqueue_advance(run_id, definition_hash)`` puts an ``advance`` job on that queue and
sets a short-lived marker ``sagas:queued:<run_id>``, in one Redis round trip. The job
deletes the marker when it starts. The sweeper treats "runnable in PostgreSQL, no marker in Redis"
as a lost wake-up and enqueues again, so a ``FLUSHALL`` loses nothing.
Duplicate jobs are harmless: claiming a run is atomic and a job that cannot
claim returns quietly.

The connection comes from django-rq (``RQ_QUEUES``, whose one entry is the
compensation queue): the dashboard at ``/django-rq/`` and the workers see the
same Redis with the same timeouts. django-rq's ``get_queue`` serves only names
listed in ``RQ_QUEUES``; the per-version queues are named at run time, so every
queue here is an ``rq.Queue`` made on that connection with that entry's
settings. Jobs are enqueued by this module only, after commit
(``enqueue_after_commit``), so django-rq's commit modes are not needed.
"""

from __future__ import annotations

import atexit
import heapq
import logging
import os
import threading
import time
from functools import lru_cache
from uuid import UUID

import django_rq
import redis
from django.conf import settings
from django.db import transaction
from rq import Queue

from core.storage import OUTAGES, REDIS, note_failure

log = logging.getLogger("sagas.runtime.queue")

MARKER_PREFIX = "sagas:queued:"
# How long a queued wake-up is trusted. A worker SIGKILLed between dequeuing a job and
# starting it leaves the marker behind with no job: the run then waits this long for the
# sweeper (the chaos test caught a run stuck for 300 s). When it lapses under a long
# backlog, the sweeper adds a duplicate job, which is harmless (claims are atomic).
MARKER_TTL_SECONDS = 20
ADVANCE_JOB = "sagas.runtime.jobs.advance"


# A run's priority: 1 is taken first, 5 last; 3 unless the workflow or the start says otherwise.
PRIORITIES = (1, 2, 3, 4, 5)
DEFAULT_PRIORITY = 3


def queue_name_for(definition_hash: str, priority: int = DEFAULT_PRIORITY) -> str:
    """The queue of one code version's runs at one priority (the default's has no suffix)."""
    base = f"{settings.SAGAS_QUEUE}:{definition_hash[:16]}"
    return base if priority == DEFAULT_PRIORITY else f"{base}:p{priority}"


def queue_names_for(hashes: set[str] | frozenset[str]) -> list[str]:
    """Every queue of these code versions, in the order a worker reads them: all of priority 1
    first, then 2, ... An idle worker takes whatever comes; a saturated one, on finishing a run,
    takes the oldest job of the highest priority waiting (RQ's BLPOP reads its keys in order)."""
    return [queue_name_for(h, p) for p in PRIORITIES for h in sorted(hashes)]


def compensation_queue_name() -> str:
    """Also the name of the ``RQ_QUEUES`` entry that configures the engine's connection."""
    return f"{settings.SAGAS_QUEUE}:compensation"


@lru_cache(maxsize=1)
def redis_connection() -> redis.Redis:
    """This process's connection to the engine's Redis (django-rq's, one per process;
    redis-py's pool makes it safe to share between threads)."""
    return django_rq.get_connection(compensation_queue_name())


@lru_cache(maxsize=256)
def get_queue(name: str) -> Queue:
    """The RQ queue ``name`` on the engine's connection, with the ``RQ_QUEUES`` entry's
    default timeout (-1: a run's job never times out; a hung run is its lease's business)."""
    config = settings.RQ_QUEUES[compensation_queue_name()]
    return Queue(name, connection=redis_connection(), default_timeout=config.get("DEFAULT_TIMEOUT"))


def marker_key(run_id: str) -> str:
    return f"{MARKER_PREFIX}{run_id}"


def enqueue_advance(
    run_id: str, definition_hash: str, *, compensating: bool = False, priority: int = DEFAULT_PRIORITY,
    marker: str = "1",
) -> bool:
    """Wake a worker that has this code version for ``run_id`` (any worker, when the run
    is ``compensating``). Returns False (and logs) when Redis is unreachable: the run is
    still safe in PostgreSQL and the sweeper will enqueue it later. ``marker`` is the value of
    the run's wake-up marker (the sweeper's, for a run whose lease expired: ``lease:<fence>``)."""
    run_id = str(run_id)
    name = compensation_queue_name() if compensating else queue_name_for(definition_hash, priority)
    try:
        rq_queue = get_queue(name)
        # One round trip: RQ's enqueue and the marker in one MULTI/EXEC pipeline (they land
        # together or not at all). ``Queue.enqueue`` would make two round trips of its own,
        # and RQ opens its transaction with MULTI, which redis-py refuses once other commands
        # are queued: so RQ's commands go in first, the marker after them.
        job = rq_queue.create_job(
            ADVANCE_JOB,
            args=(run_id,),
            timeout=-1,
            result_ttl=0,
            failure_ttl=24 * 3600,
            description=f"advance {run_id}",
        )
        with redis_connection().pipeline() as pipe:
            rq_queue.enqueue_job(job, pipeline=pipe)
            pipe.set(marker_key(run_id), marker, ex=MARKER_TTL_SECONDS)
            pipe.execute()
    except redis.RedisError as exc:
        # One line per outage (not per run); the run is safe in PostgreSQL and the
        # sweeper enqueues it once Redis answers again.
        note_failure(exc, doing="enqueueing runs (the sweeper will enqueue them later)")
        log.debug("could not enqueue run %s (%s)", run_id, exc)
        return False
    OUTAGES.up(REDIS)
    return True


def enqueue_after_commit(
    run_id: str | UUID, definition_hash: str, *, compensating: bool = False, priority: int = DEFAULT_PRIORITY
) -> None:
    """Enqueue once the surrounding transaction commits (immediately in autocommit)."""
    run = str(run_id)
    transaction.on_commit(
        lambda: enqueue_advance(run, definition_hash, compensating=compensating, priority=priority))


class _Later:
    """Wake-ups sent a moment after their commit, from one daemon thread per process, in the
    order they were asked for. Left unsent only if the process dies within the delay: the
    sweeper finds the run in PostgreSQL then, as for any lost wake-up. A clean exit sends what
    is left at once (``atexit``)."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.due: list[tuple[float, int, str, str, int]] = []
        self.seq = 0
        self.sending = 0  # taken off ``due`` by the thread and not sent yet
        self.thread: threading.Thread | None = None

    def add(self, delay: float, run_id: str, definition_hash: str, priority: int) -> None:
        with self.cv:
            self.seq += 1
            heapq.heappush(self.due, (time.monotonic() + delay, self.seq, run_id, definition_hash, priority))
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="sagas-wake-later", daemon=True)
                self.thread.start()
            self.cv.notify()

    def _take(self, *, all_of_them: bool) -> list[tuple[float, int, str, str, int]]:
        now, out = time.monotonic(), []
        while self.due and (all_of_them or self.due[0][0] <= now):
            out.append(heapq.heappop(self.due))
        return out

    def _run(self) -> None:
        while True:
            with self.cv:
                while not self.due or self.due[0][0] > time.monotonic():
                    self.cv.wait(timeout=None if not self.due else max(0.0, self.due[0][0] - time.monotonic()))
                ready = self._take(all_of_them=False)
                self.sending += len(ready)
            try:
                self._send(ready)
            finally:
                with self.cv:
                    self.sending -= len(ready)
                    self.cv.notify_all()

    def flush(self, *, timeout: float = 10.0) -> None:
        """Send what is due later now, and wait for what the thread is sending: at exit the
        thread dies with the interpreter, and a wake-up it had taken but not sent would be lost
        (the README's example lost one: the script's exit came just after the delay)."""
        with self.cv:
            ready = self._take(all_of_them=True)
        self._send(ready)
        with self.cv:
            self.cv.wait_for(lambda: self.sending == 0, timeout=timeout)

    @staticmethod
    def _send(ready: list[tuple[float, int, str, str, int]]) -> None:
        """Enqueue each, in order, until Redis refuses one: the rest are left to the sweeper (their
        runs are safe in PostgreSQL), so an outage costs one failed call per batch, not one per
        run, and never holds a process's exit for a timeout per run."""
        for _, _, run_id, definition_hash, priority in ready:
            if not enqueue_advance(run_id, definition_hash, priority=priority):
                return

    def forget_in_child(self) -> None:  # a forked child has no thread; its parent sends these
        self.cv, self.due, self.sending, self.thread = threading.Condition(), [], 0, None

    def drop(self) -> None:
        with self.cv:
            self.due.clear()


_later = _Later()
atexit.register(_later.flush)
os.register_at_fork(after_in_child=_later.forget_in_child)


def drop_wakeups_due_later() -> None:
    """Forget the wake-ups this process has yet to send (a test harness between tests: their
    runs are gone with the test's database)."""
    _later.drop()


def enqueue_new_run_after_commit(run_id: str | UUID, definition_hash: str, *, priority: int = DEFAULT_PRIORITY) -> None:
    """A new run's wake-up, after its commit. With workers listening for runs made runnable
    (``SAGAS_DISPATCH_LISTEN``), an idle one takes the run from PostgreSQL's announcement within
    milliseconds; RQ's job then only matters if none was free, so it goes
    ``SAGAS_DISPATCH_RQ_DELAY`` later, from a thread of this process: the caller of ``start()``
    does not wait for Redis, and the worker taking the run is not competing with RQ's wake-up of
    a thread for the same run."""
    delay = float(getattr(settings, "SAGAS_DISPATCH_RQ_DELAY", 0.0))
    if delay <= 0 or not getattr(settings, "SAGAS_DISPATCH_LISTEN", False):
        enqueue_after_commit(run_id, definition_hash, priority=priority)
        return
    run = str(run_id)
    transaction.on_commit(lambda: _later.add(delay, run, definition_hash, priority))


def clear_marker(run_id: str) -> None:
    try:
        redis_connection().delete(marker_key(run_id))
    except redis.RedisError as exc:  # the job still runs; the marker just lapses
        log.warning("could not clear queue marker for %s: %s", run_id, exc)


def queued_markers(run_ids: list[str]) -> dict[str, str] | None:
    """The runs of ``run_ids`` that a queue still holds a wake-up for, with their marker's value
    (``enqueue_advance``'s ``marker``); None while Redis is unreachable."""
    if not run_ids:
        return {}
    conn = redis_connection()
    pipe = conn.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.get(marker_key(run_id))
    try:
        values = pipe.execute()
    except redis.RedisError as exc:
        # Redis is away: nothing can be enqueued now anyway. The caller skips every run;
        # a later pass finds them again.
        note_failure(exc, doing="sweeping")
        return None
    OUTAGES.up(REDIS)
    return {run_id: value.decode() if isinstance(value, bytes) else str(value)
            for run_id, value in zip(run_ids, values, strict=True) if value is not None}

"""Our own storage going away: how every long-lived process notices, waits and says so.

PostgreSQL restarts, fails over or drops a connection; Redis stops or is flushed.
None of this is a workflow's failure, and none of it should make a process fail
hundreds of jobs a second or die. This module is the one place that knows:

* which exceptions mean "the server under us is unreachable" (``is_storage_error``):
  connection and operational errors of PostgreSQL (through Django or raw psycopg)
  and of Redis. Constraint violations and bad data are not among them: those are
  answers from a working server;
* how to drop a dead database connection so the next query opens a new one
  (``drop_connection``). Django only drops a broken connection lazily, and only
  when the error went through its own wrapper;
* how long to wait between tries (``Backoff``: exponential with full jitter,
  capped at a few seconds, so a fleet of workers does not reconnect in step);
* how to report an outage: ``OUTAGES.down(...)`` logs ONE line when a resource
  becomes unreachable, ``OUTAGES.up(...)`` ONE line when it answers again, with
  how long it was gone. Per process, thread-safe; the many threads of one worker
  share the line.

What is guaranteed: the helpers here never raise a storage error themselves
except where they say so. What is not: that the server comes back; callers bound
their waits (a lease, a stop event).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import psycopg
import redis
from django.db import DatabaseError, InterfaceError, OperationalError, connection

log = logging.getLogger("sagas.storage")

POSTGRES = "PostgreSQL"
REDIS = "Redis"

_PG_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
)
_REDIS_ERRORS: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)


def is_database_error(exc: BaseException) -> bool:
    """PostgreSQL unreachable, restarting, or the connection dropped (or a deadlock/serialization
    failure: also transient, also worth a retry). Not IntegrityError or DataError."""
    if isinstance(exc, _PG_ERRORS):
        return True
    # Django wraps a psycopg error from a query as its own class of the same name; a raw
    # DatabaseError whose cause is a connection problem counts too.
    return isinstance(exc, DatabaseError) and isinstance(exc.__cause__, _PG_ERRORS)


def is_redis_error(exc: BaseException) -> bool:
    return isinstance(exc, _REDIS_ERRORS)


def is_storage_error(exc: BaseException) -> bool:
    return is_database_error(exc) or is_redis_error(exc)


def resource_of(exc: BaseException) -> str:
    return REDIS if is_redis_error(exc) else POSTGRES


def drop_connection() -> None:
    """Close this thread's database connection so that the next query reconnects.

    Safe on a connection that is already dead. Inside a transaction Django marks the
    connection as closed in the transaction; the enclosing ``atomic`` then unwinds.
    """
    try:
        connection.close()
    except Exception:  # a broken socket can refuse even to close: forget it
        connection.connection = None


class Backoff:
    """Delays for retries: exponential from ``base`` to ``cap`` seconds, with full jitter."""

    def __init__(self, base: float = 0.05, cap: float = 2.0) -> None:
        self.base, self.cap = base, cap
        self.attempt = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * (2**self.attempt))
        self.attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def sleep(self, stop: threading.Event | None = None, *, until: float | None = None) -> bool:
        """Sleep the next delay (not past the monotonic ``until``). False if ``stop`` was set."""
        delay = self.next_delay()
        if until is not None:
            delay = max(0.0, min(delay, until - time.monotonic()))
        if stop is not None:
            return not stop.wait(delay)
        time.sleep(delay)
        return True


class Outages:
    """One log line when a resource goes away and one when it is back, per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}
        self.count: dict[str, int] = {}

    def down(self, resource: str, exc: BaseException | str, *, doing: str = "") -> None:
        with self._lock:
            if resource in self._since:
                return
            self._since[resource] = time.monotonic()
            self.count[resource] = self.count.get(resource, 0) + 1
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.warning(
            "storage outage: %s unreachable%s (%s: %s); backing off and retrying",
            resource, f" while {doing}" if doing else "", type(exc).__name__ if not isinstance(exc, str) else "error",
            detail[:200],
        )

    def up(self, resource: str) -> None:
        if resource not in self._since:  # the common case: no lock on the hot path
            return
        with self._lock:
            since = self._since.pop(resource, None)
        if since is not None:
            log.warning("storage outage over: %s answers again after %.1f s", resource, time.monotonic() - since)

    def is_down(self, resource: str) -> bool:
        return resource in self._since


OUTAGES = Outages()


def database_usable() -> bool:
    """One ``SELECT 1`` on this thread's connection (reconnecting if needed); never raises."""
    try:
        connection.ensure_connection()
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return True
    except Exception as exc:
        if not is_database_error(exc):
            raise
        drop_connection()
        return False


def wait_for_database(
    *, stop: threading.Event | None = None, until: float | None = None, doing: str = ""
) -> bool:
    """Block until PostgreSQL answers. False if ``stop`` was set or the monotonic ``until``
    passed first. Logs the outage's start and end once per process."""
    backoff = Backoff()
    while True:
        if database_usable():
            OUTAGES.up(POSTGRES)
            return True
        OUTAGES.down(POSTGRES, "no answer", doing=doing)
        if until is not None and time.monotonic() >= until:
            return False
        if not backoff.sleep(stop, until=until):
            return False


def wait_for_redis(
    conn: redis.Redis, *, stop: threading.Event | None = None, until: float | None = None, doing: str = ""
) -> bool:
    """Block until Redis answers a PING; same contract as ``wait_for_database``."""
    backoff = Backoff(base=0.1)
    while True:
        try:
            conn.ping()
            OUTAGES.up(REDIS)
            return True
        except _REDIS_ERRORS as exc:
            OUTAGES.down(REDIS, exc, doing=doing)
        if until is not None and time.monotonic() >= until:
            return False
        if not backoff.sleep(stop, until=until):
            return False


def note_failure(exc: BaseException, *, doing: str = "") -> None:
    """Record a storage error seen by the caller (and drop a dead DB connection)."""
    if is_database_error(exc):
        drop_connection()
    OUTAGES.down(resource_of(exc), exc, doing=doing)


def note_success(resource: str = POSTGRES) -> None:
    OUTAGES.up(resource)


_T = TypeVar("_T")


def retry_storage(fn: Callable[[], _T], *, stop: threading.Event | None = None, doing: str = "") -> _T | None:
    """Call ``fn`` until it does not fail with a storage error (other errors propagate).

    For idempotent reads and writes in long-lived loops (sweeper, reconciler, load
    generator) whose work is worth waiting for rather than failing. Returns None if
    ``stop`` was set while waiting.
    """
    backoff = Backoff()
    while True:
        try:
            value = fn()
        except Exception as exc:
            if not is_storage_error(exc):
                raise
            note_failure(exc, doing=doing)
            if not backoff.sleep(stop):
                return None
            continue
        OUTAGES.up(POSTGRES)
        return value

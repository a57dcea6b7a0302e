"""Console page reads from a PostgreSQL standby (``DATABASE_REPLICA_URL``).

With the setting, ``config/settings.py`` adds the database alias ``replica`` and installs
``ReplicaRouter``; without it neither exists and nothing here runs.

What goes where:

* A read goes to the standby only inside ``reads_on_replica()`` (the console's page views
  enter it for GET and HEAD: console/views/base.py ``viewer_required``), and never inside a
  transaction on the primary: an action's row locks (``select_for_update``), the read that
  checks an operator's expected state, and every write stay on the primary. Everything else
  (the engine, workers, the sweeper, the API, the live pushes) never enters it.
* Writes always go to the primary, also for an object read from the standby.

Health (``replica_state``): the standby is asked, at most once every ``CHECK_SECONDS`` per
process, how far its replay is behind: 0 when it has replayed all the WAL it received, else
the age of the last transaction it replayed. A standby that cannot be reached (refused, or
no answer within the connect timeout) is left alone for ``DOWN_SECONDS``: pages read the
primary meanwhile, and the outage is logged once (core/storage.py ``OUTAGES``).

Read your own writes: a browser that has just sent a POST (an action) gets a short-lived cookie
(``AFTER_WRITE_COOKIE``, ``AFTER_WRITE_SECONDS``; ``AfterWriteMiddleware``), and while it has it
its pages read the primary, so the page an action redirects to shows the action. The cookie can
only send reads to the primary, never a write anywhere else.

Not guaranteed: what a page shows is as old as the standby's replay (``lag``); another person's
page read from the standby right after an action may not show it yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from core.storage import OUTAGES, is_database_error

REPLICA = "replica"
RESOURCE = "PostgreSQL standby"
CHECK_SECONDS = 2.0
DOWN_SECONDS = 10.0
BEHIND_NOTICE_SECONDS = 1.0
AFTER_WRITE_COOKIE = "saga_primary"
AFTER_WRITE_SECONDS = 10
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")

T = TypeVar("T")
log = logging.getLogger("core.replica")

_on_replica: ContextVar[bool] = ContextVar("reads_on_replica", default=False)

# 0 when the standby has replayed everything it received (an idle primary is not "behind");
# on a server that is not a standby both functions are NULL and the answer is 0.
LAG_SQL = """
SELECT CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE COALESCE(EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()), 0) END
"""


@dataclass(frozen=True)
class ReplicaState:
    up: bool
    lag: float  # seconds behind the primary, as last measured
    checked: float  # time.monotonic() of the measurement


_state = ReplicaState(up=True, lag=0.0, checked=float("-inf"))
_checking = threading.Lock()


def configured() -> bool:
    return REPLICA in connections.settings


class ReplicaRouter:
    """Reads on the standby only inside ``reads_on_replica()`` and outside any transaction on
    the primary; writes, migrations and everything else on the primary."""

    def db_for_read(self, model: type, **hints: Any) -> str:
        if _on_replica.get() and not connections[DEFAULT_DB_ALIAS].in_atomic_block:
            return REPLICA
        return DEFAULT_DB_ALIAS  # explicit: an object read from the standby is not followed back there

    def db_for_write(self, model: type, **hints: Any) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool:
        return True  # both aliases hold the same data

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool:
        return db == DEFAULT_DB_ALIAS


def replica_state() -> ReplicaState:
    """The standby's health, measured again when older than CHECK_SECONDS (or DOWN_SECONDS
    after a failure). One thread measures at a time; the others use the last answer."""
    global _state
    now = time.monotonic()
    wait = DOWN_SECONDS if not _state.up else CHECK_SECONDS
    if now - _state.checked < wait or not _checking.acquire(blocking=False):
        return _state
    try:
        _state = _measure()
    finally:
        _checking.release()
    return _state


def mark_down(exc: BaseException) -> None:
    """The standby failed a page's query: pages read the primary for DOWN_SECONDS."""
    global _state
    OUTAGES.down(RESOURCE, exc, doing="reading a console page")
    _state = ReplicaState(up=False, lag=0.0, checked=time.monotonic())


def _measure() -> ReplicaState:
    if not _state.up and not _replica_answers():  # still down: no page waits on the pool for it
        return ReplicaState(up=False, lag=0.0, checked=time.monotonic())
    try:
        with connections[REPLICA].cursor() as cursor:
            cursor.execute(LAG_SQL)
            row = cursor.fetchone()
    except Exception as exc:
        if not is_database_error(exc):
            raise
        connections[REPLICA].close()
        OUTAGES.down(RESOURCE, exc, doing="measuring its lag")
        return ReplicaState(up=False, lag=0.0, checked=time.monotonic())
    OUTAGES.up(RESOURCE)
    return ReplicaState(up=True, lag=max(0.0, float(row[0] or 0)), checked=time.monotonic())


def reading_replica() -> bool:
    return _on_replica.get()


@contextmanager
def reads_on_replica() -> Iterator[None]:
    token = _on_replica.set(True)
    try:
        yield
    finally:
        _on_replica.reset(token)


def page_on_replica(view: Callable[[], T], *, after_write: bool = False) -> T:
    """``view()`` with its reads on the standby when one is configured and up, and the browser
    has not just written (``after_write``); when the standby fails during it, it is marked down
    and ``view()`` runs again on the primary (a page view only reads, so running it again is
    safe)."""
    if not configured() or after_write or not replica_state().up:
        return view()
    try:
        with reads_on_replica():
            return view()
    except Exception as exc:
        if not is_database_error(exc) or _replica_answers():
            raise
        mark_down(exc)
        return view()


def follow(items: Iterable[T]) -> Iterator[T]:
    """``items`` consumed with reads on the standby if the caller's are now (a streamed export,
    whose body is read after its view returned, in another thread)."""
    if not _on_replica.get():
        return iter(items)
    return _on_replica_each(iter(items))


def _on_replica_each(iterator: Iterator[T]) -> Iterator[T]:
    while True:
        with reads_on_replica():
            try:
                item = next(iterator)
            except StopIteration:
                return
        yield item


def behind_seconds() -> int | None:
    """For the page being read from the standby: how far behind it is, when more than
    BEHIND_NOTICE_SECONDS; else None."""
    if not _on_replica.get():
        return None
    lag = _state.lag
    return round(lag) if _state.up and lag > BEHIND_NOTICE_SECONDS else None


class AfterWriteMiddleware:
    """Marks a browser that sent a POST (or any unsafe method) for AFTER_WRITE_SECONDS, so that
    its next pages read the primary. Installed only with a standby (config/settings.py)."""

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        response = self.get_response(request)
        if request.method not in SAFE_METHODS and response.status_code < 500:
            response.set_cookie(AFTER_WRITE_COOKIE, "1", max_age=AFTER_WRITE_SECONDS, httponly=True, samesite="Lax",
                                secure=settings.SESSION_COOKIE_SECURE)
        return response


def _replica_answers() -> bool:
    """Whether the standby accepts a connection: one of its own, not the pool's (which would
    wait its whole timeout for a server that refuses at once)."""
    try:
        with psycopg.connect(**connections[REPLICA].get_connection_params()) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False

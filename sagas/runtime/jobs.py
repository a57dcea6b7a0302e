"""RQ job entry points. They take ids, never model instances."""

from __future__ import annotations

from django.db import close_old_connections

from core.storage import wait_for_database
from sagas.errors import StorageUnavailable
from sagas.replay import engine
from sagas.replay.context import shutdown_requested
from sagas.runtime import queue


def advance(run_id: str) -> str:
    """Advance one run (the ``advance`` job): its wake-up marker is cleared first, then
    ``advance_now``."""
    queue.clear_marker(run_id)
    return advance_now(run_id)


def advance_now(run_id: str) -> str:
    """Advance one run whose wake-up marker the caller has cleared. While PostgreSQL is
    unreachable the job waits (backing off, one log line per outage) instead of failing: a
    worker that failed every job at once would burn its queue and its CPU for nothing. On
    shutdown it gives up; the run is still PENDING in PostgreSQL and the sweeper wakes it."""
    # Drop a connection that broke since the last job (Django checks it lazily).
    close_old_connections()
    while True:
        try:
            return engine.advance(run_id).value
        except StorageUnavailable:
            if not wait_for_database(stop=shutdown_requested, doing="claiming runs"):
                return engine.Outcome.STORAGE_UNAVAILABLE.value

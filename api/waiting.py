"""Waiting for a run to settle without polling: PostgreSQL ``LISTEN saga_run_status``.

Every status change of a run is announced on commit by a trigger (migration
``api/0002_run_finished_notify``) as ``"<run id>:<status>"``. One process-wide listener
thread holds one dedicated psycopg connection with ``LISTEN`` and wakes the waiters of that
run; a waiter is an ``asyncio.Event`` in the event loop of an async request, so a waiting
request holds no thread and no database connection.

Guarantees:

* No lost wake-up: a waiter subscribes *before* it reads the run, and clears its event before
  every read, so a change committed after the read is always heard.
* A run is settled (the wait ends) when it is finished (``TERMINAL_STATUSES``) or needs a
  person: ``NEEDS_ATTENTION``, or ``WAITING`` on an open approval. A ``WAITING`` run on a timer
  or a signal resumes by itself, so the wait goes on.
* If the listener's connection dies (PostgreSQL restarted), waiters still answer at their
  timeout, with the run as it is then; the listener reconnects with backoff and, once
  listening again, wakes every waiter to re-read (a change made while nobody listened is not
  missed). Nothing here can hang a request or stop the process.

Not guaranteed: an answer within the timeout when PostgreSQL is down (the final read then
fails, and the API answers 503 ``unavailable``).

The listener starts on the first wait in a process and lives as long as the process. Tests
therefore wait through a served API (``api_server``), not the in-process test client: a
listener in the test process would keep a connection to the test database open.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections

from core.direct import session_conninfo
from sagas.models import OPEN_APPROVAL_STATES, TERMINAL_STATUSES, RunStatus, WorkflowRun

log = logging.getLogger("api.waiting")
CHANNEL = "saga_run_status"
MAX_WAIT_S = 60.0
# Statuses after which a waiter re-reads the run; others (PENDING, RUNNING, COMPENSATING) cannot settle it.
WAKE_STATUSES = frozenset(TERMINAL_STATUSES | {RunStatus.NEEDS_ATTENTION, RunStatus.WAITING})
RECONNECT_MIN_S, RECONNECT_MAX_S = 0.2, 5.0
# The listener checks its connection at least this often (a silent network loss is caught by keepalives).
IDLE_CHECK_S = 5.0


def run_settled(run: WorkflowRun) -> bool:
    """Finished, or stopped until a person acts (NEEDS_ATTENTION, or WAITING on an open approval)."""
    if run.status in TERMINAL_STATUSES or run.status == RunStatus.NEEDS_ATTENTION:
        return True
    return run.status == RunStatus.WAITING and run.approvals.filter(state__in=OPEN_APPROVAL_STATES).exists()


class _Waiter:
    __slots__ = ("event", "loop", "run_id")

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def wake(self) -> None:
        """Thread-safe: set the event in the waiter's own loop."""
        try:
            self.loop.call_soon_threadsafe(self.event.set)
        except RuntimeError:  # its loop closed: nobody waits any more
            pass


class RunStatusListener:
    """One thread, one connection, ``LISTEN saga_run_status``; dispatches to per-run waiters."""

    def __init__(self, alias: str = "default") -> None:
        self.alias = alias
        self._lock = threading.Lock()
        self._waiters: dict[str, set[_Waiter]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.listening = threading.Event()
        self.connects = 0
        self.notifications = 0

    # --- waiters (event loop side) ---

    def subscribe(self, run_id: str) -> _Waiter:
        self.ensure_started()
        waiter = _Waiter(run_id)
        with self._lock:
            self._waiters.setdefault(run_id, set()).add(waiter)
        return waiter

    def unsubscribe(self, waiter: _Waiter) -> None:
        with self._lock:
            waiters = self._waiters.get(waiter.run_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[waiter.run_id]

    def waiting(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiters.values())

    # --- the listener thread ---

    def ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="saga-run-status-listener", daemon=True)
                self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _conninfo(self) -> dict[str, Any]:
        # LISTEN needs a session: behind a transaction pooler, the direct URL (core.direct).
        params = session_conninfo() if self.alias == "default" else dict(
            connections[self.alias].get_connection_params())
        for django_only in ("cursor_factory", "context", "prepare_threshold", "server_side_binding",
                            "isolation_level", "assume_role", "pool"):
            params.pop(django_only, None)
        params.setdefault("connect_timeout", 5)
        params.update(application_name="saga-api-wait-listener", keepalives=1, keepalives_idle=10,
                      keepalives_interval=5, keepalives_count=3)
        return params

    def _run(self) -> None:
        import psycopg

        delay = RECONNECT_MIN_S
        while not self._stop.is_set():
            try:
                with psycopg.connect(autocommit=True, **self._conninfo()) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.connects += 1
                    if self.connects > 1:
                        log.warning("run status listener: listening again")
                    self.listening.set()
                    delay = RECONNECT_MIN_S
                    # Whatever changed while nobody listened (or before a waiter's read) is re-read now.
                    self._wake_all()
                    while not self._stop.is_set():
                        for notify in conn.notifies(timeout=IDLE_CHECK_S):
                            self._dispatch(notify.payload)
                        conn.execute("SELECT 1")  # a dead connection raises here if notifies() did not
            except Exception as exc:  # any failure: waiters fall back to their timeout
                if self.listening.is_set() or self.connects == 0:
                    log.warning("run status listener: connection lost (%s); waits end at their timeout "
                                "until it reconnects", str(exc).strip()[:200])
            self.listening.clear()
            self._stop.wait(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    def _dispatch(self, payload: str) -> None:
        self.notifications += 1
        run_id, _, status = payload.partition(":")
        if status not in WAKE_STATUSES:
            return
        with self._lock:
            waiters = list(self._waiters.get(run_id, ()))
        for waiter in waiters:
            waiter.wake()

    def _wake_all(self) -> None:
        with self._lock:
            waiters = [w for ws in self._waiters.values() for w in ws]
        for waiter in waiters:
            waiter.wake()


listener = RunStatusListener()


def _read(run_id: str, user: Any, release: bool) -> tuple[WorkflowRun | None, bool]:
    from operators.selectors.runs import run_get

    run = run_get(run_id, user=user)
    settled = run is not None and run_settled(run)
    if release and run is not None and not settled:
        # The wait may be long: give the connection back rather than hold one per waiting request
        # (never one inside a transaction: a test's, or a caller's).
        for conn in connections.all(initialized_only=True):
            if not conn.in_atomic_block:
                conn.close()
    return run, settled


async def run_wait(run_id: str, *, user: Any, timeout: float) -> WorkflowRun | None:
    """The run once it is settled (``run_settled``) or ``timeout`` seconds passed, whichever is
    first; None at once for an unknown id or a run outside ``user``'s tenants."""
    try:
        key = str(uuid.UUID(run_id))
    except (ValueError, TypeError, AttributeError):
        return None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(timeout, MAX_WAIT_S)
    read = sync_to_async(_read)
    waiter = listener.subscribe(key)
    try:
        while True:
            waiter.event.clear()  # before the read: a change committed after it sets the event again
            remaining = deadline - loop.time()
            run, settled = await read(key, user, remaining > 0)
            if run is None or settled or remaining <= 0:
                return run
            try:
                await asyncio.wait_for(waiter.event.wait(), remaining)
            except TimeoutError:
                pass
    finally:
        listener.unsubscribe(waiter)

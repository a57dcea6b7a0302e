"""The fast dispatch path: a run that becomes runnable goes straight to an idle thread of a worker
that has its code, woken by PostgreSQL's ``NOTIFY`` on the commit that made it runnable.

A trigger (migration ``sagas/0031_dispatch_notify``) announces every run inserted or updated to
PENDING on channel ``sagas_dispatch`` as ``"<run id> <hash prefix> <priority>"``. Each worker
process holds one connection that ``LISTEN``s, and hands a run whose code it has to one of its
fast threads when one of the process's ``concurrency`` slots is free. The slots are shared with
the RQ threads (``slots``): a process never advances more runs at once than its concurrency, and
a saturated process leaves announcements alone, so the RQ queues (per priority) decide what runs
next when workers are busy.

RQ stays the durable wake-up: the same run's job arrives a moment later and its claim finds the
run taken or done (claims are atomic, so a run is never advanced twice at once). A lost
announcement (no listener, a connection that just died) costs nothing but the RQ path's latency,
and the sweeper finds any run both missed, from PostgreSQL, as before.

Several processes hear the same announcement and each may try to claim: one wins, the others
return at once (``NOT_CLAIMED``), as with duplicate RQ jobs.
"""

from __future__ import annotations

import logging
import queue as queues
import threading
from typing import Any

from django.conf import settings
from django.db import connection

from core.direct import session_conninfo
from core.storage import is_storage_error, note_failure
from sagas.replay.context import shutdown_requested
from sagas.runtime.identity import set_thread_worker_id

log = logging.getLogger("sagas.runtime.dispatch")
CHANNEL = "sagas_dispatch"
RECONNECT_MIN_S, RECONNECT_MAX_S = 0.2, 5.0
IDLE_CHECK_S = 5.0


class Slots:
    """The runs a process advances at once: its concurrency, shared by the RQ threads (which wait
    for a slot) and the fast threads (which take one only if it is free and no RQ thread waits).

    An RQ thread waits for its slot holding a job it has already dequeued, the oldest of the
    highest priority waiting. A slot given back goes to it, not to the next announcement: while
    10,000 runs were being started, their announcements took most freed slots from the RQ
    threads (a semaphore's waiter must still win the race for a released slot), and runs whose
    held calls had been let go, woken through the first queue, waited behind runs not started
    yet."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = threading.BoundedSemaphore(size)
        self._waiting = 0
        self._lock = threading.Lock()

    def take(self) -> None:
        if self._free.acquire(blocking=False):
            return
        with self._lock:
            self._waiting += 1
        try:
            self._free.acquire()
        finally:
            with self._lock:
                self._waiting -= 1

    def try_take(self) -> bool:
        if self._waiting:  # a dequeued job waits for the next free slot: the queues decide
            return False
        return self._free.acquire(blocking=False)

    def give_back(self) -> None:
        self._free.release()


slots: Slots | None = None  # set by the worker command; None in other processes (no limit)

# Runs this process's fast threads took lately: their RQ job, which arrives a moment later, is
# then only cleared away (no slot, no claim), so it takes as little of the process's time as it can.
_taken: dict[str, None] = {}
_taken_lock = threading.Lock()
TAKEN_KEPT = 4096


def note_taken(run_id: str) -> None:
    with _taken_lock:
        _taken[run_id] = None
        if len(_taken) > TAKEN_KEPT:
            del _taken[next(iter(_taken))]


def was_taken(run_id: str, *, forget: bool = True) -> bool:
    """Whether a fast thread of this process took ``run_id`` (forgotten once asked, unless not
    ``forget``)."""
    with _taken_lock:
        if not forget:
            return run_id in _taken
        return _taken.pop(run_id, 0) is None


def install_slots(size: int) -> Slots:
    global slots
    slots = Slots(size)
    return slots


class DispatchListener(threading.Thread):
    """``LISTEN sagas_dispatch`` on a connection of its own; runs with code here go to a fast
    thread when a slot is free. Reconnects with back-off; never stops the process."""

    def __init__(self, *, name: str, hash_prefixes: frozenset[str], size: int, stop: threading.Event) -> None:
        super().__init__(name="sagas-dispatch-listener", daemon=True)
        self.worker_name, self.prefixes, self.stop_event = name, hash_prefixes, stop
        self.handoff: queues.SimpleQueue[str | None] = queues.SimpleQueue()
        self.fast = [FastThread(self, f"{name}/f{i}") for i in range(1, size + 1)]
        self.listening = threading.Event()
        self.handed = 0

    def _conninfo(self) -> dict[str, Any]:
        params = session_conninfo()  # LISTEN needs a session: behind a transaction pooler, the direct URL
        params.setdefault("connect_timeout", 5)
        # The process's own name (``sagas_worker <name>``, set by the command): an operator who
        # ends a worker's sessions by name in pg_stat_activity ends this one too, and it reconnects.
        params.setdefault("application_name", f"sagas_worker {self.worker_name}"[:63])
        params.update(keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3)
        return params

    def run(self) -> None:
        import psycopg

        for thread in self.fast:
            thread.start()
        delay = RECONNECT_MIN_S
        try:
            while not self.stop_event.is_set():
                try:
                    with psycopg.connect(autocommit=True, **self._conninfo()) as conn:
                        conn.execute(f"LISTEN {CHANNEL}")
                        self.listening.set()
                        delay = RECONNECT_MIN_S
                        while not self.stop_event.is_set():
                            for notify in conn.notifies(timeout=1.0):
                                self._heard(notify.payload)
                                if self.stop_event.is_set():
                                    break
                            conn.execute("SELECT 1")  # a dead connection raises here if notifies() did not
                except Exception as exc:  # the RQ path and the sweeper carry on meanwhile
                    if self.listening.is_set():
                        log.warning("dispatch listener: connection lost (%s); RQ wakes the runs until it is back",
                                    str(exc).strip()[:200])
                self.listening.clear()
                self.stop_event.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
        finally:
            for _ in self.fast:
                self.handoff.put(None)

    def drain(self, *, timeout: float) -> None:
        """On the worker's way out (its stop event set): let each fast thread finish the run it
        holds, which hands itself back at its next step boundary (``shutdown_requested``)."""
        for _ in self.fast:
            self.handoff.put(None)
        for thread in self.fast:
            if thread.is_alive():
                thread.join(timeout=timeout)

    def _heard(self, payload: str) -> None:
        run_id, _, rest = payload.partition(" ")
        prefix = rest.partition(" ")[0]
        if shutdown_requested.is_set():
            # Stopping: a run handed back at its step boundary announces itself as PENDING; taking
            # it here would claim it only to hand it back again, announce again, and so on.
            return
        if prefix not in self.prefixes or slots is None or not slots.try_take():
            return  # not our code, or every slot busy: RQ's queues decide
        self.handed += 1
        self.handoff.put(run_id)


class FastThread(threading.Thread):
    """Advances runs handed over by the listener, each under a slot it already holds."""

    def __init__(self, listener: DispatchListener, name: str) -> None:
        super().__init__(name=f"sagas-fast {name}", daemon=True)
        self.listener, self.worker_name = listener, name

    def run(self) -> None:
        from sagas.runtime import jobs

        set_thread_worker_id(self.worker_name)
        try:
            while (run_id := self.listener.handoff.get()) is not None:
                try:
                    if shutdown_requested.is_set():
                        continue  # handed over just before the stop: the run stays PENDING for another worker
                    note_taken(run_id)
                    jobs.advance_now(run_id)
                except Exception as exc:
                    if is_storage_error(exc):
                        note_failure(exc, doing="advancing runs")
                    else:
                        log.exception("run %s: the fast path failed; its RQ job or the sweeper takes it", run_id)
                    connection.close()
                finally:
                    if slots is not None:
                        slots.give_back()
        finally:
            connection.close()


def enabled() -> bool:
    return bool(getattr(settings, "SAGAS_DISPATCH_LISTEN", True))

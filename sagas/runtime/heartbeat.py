"""The heartbeat: a thread that keeps a claimed run's lease while its worker advances it."""

from __future__ import annotations

import logging
import threading
import time
from typing import TypeVar

from django.db import connection

from core.storage import is_storage_error, note_failure, note_success
from sagas import events
from sagas.replay.cursor import JournalCursor
from sagas.store import systemdb

_Cursor = TypeVar("_Cursor", bound=JournalCursor)

log = logging.getLogger("sagas.replay.engine")

# Seconds after a claim before it is announced (``run_changed``, cause "claimed"), if the
# run is still under way.
CLAIM_SIGNAL_DELAY = 0.2


class Heartbeat:
    """Extends the lease every ttl/3 on its own connection until stopped.

    If a renewal matches no row the lease is gone; the main thread will find out
    at its next write (which the fence refuses), so the heartbeat just stops.

    It also watches the journal position of the ``Context`` given to ``watch``: while
    it moves, ``run_changed`` (cause "progress") is sent at most once per
    ``events.PROGRESS_INTERVAL``, from this thread, so the step loop itself stays
    one commit per step with nothing else.

    And it announces the claim (``run_changed``, cause "claimed") ``CLAIM_SIGNAL_DELAY``
    after it, if the run is still under way then. A run that leaves the worker sooner is
    announced once, by its outcome's signal: the console's live pages would not have shown
    a RUNNING that short, and publishing it cost the worker about as much CPU as the
    outcome's (measured: 1.5 to 3.7 ms per 20-step run for the two), and its first step a
    thread competing for the interpreter.
    """

    def __init__(
        self, run_id: str, fence: int, ttl: float, *, status: str, claimed_at: float | None = None
    ) -> None:
        self.run_id, self.fence, self.ttl, self.status = run_id, fence, ttl, status
        self.lost = False
        # Monotonic time until which the lease surely holds: a renewal that started at
        # t and succeeded extends it to t + ttl (the database's clock started later).
        self.lease_until = (time.monotonic() if claimed_at is None else claimed_at) + ttl
        self._stop = threading.Event()
        self._done = threading.Event()
        self._ctx: JournalCursor | None = None
        self._seen_seq = 0
        self._progress_sent = 0.0
        self._announce_at: float | None = time.monotonic() + CLAIM_SIGNAL_DELAY

    def watch(self, ctx: _Cursor) -> _Cursor:
        self._seen_seq = ctx.last_seq
        self._ctx = ctx
        ctx.lease_until = self.lease_until
        return ctx

    def _announce_claim(self) -> None:
        if self._announce_at is None or time.monotonic() < self._announce_at:
            return
        self._announce_at = None
        if self._ctx is not None:  # the claim's signal stands for the progress made so far
            self._seen_seq = self._ctx.last_seq
        self._progress_sent = time.monotonic()
        events.send_run_changed_now(self.run_id, self.status, cause="claimed")

    def _report_progress(self) -> None:
        ctx = self._ctx
        if ctx is None or ctx.last_seq == self._seen_seq:
            return
        now = time.monotonic()
        if now - self._progress_sent < events.PROGRESS_INTERVAL:
            return
        self._seen_seq, self._progress_sent = ctx.last_seq, now
        events.send_run_changed_now(self.run_id, self.status, cause="progress")

    def _next_report(self) -> float:
        if self._announce_at is not None:
            return max(0.0, self._announce_at - time.monotonic())
        return events.PROGRESS_INTERVAL

    def __enter__(self) -> Heartbeat:
        _keeper().serve(self)
        return self

    def __exit__(self, *exc: object) -> None:
        # Returns once nothing of this heartbeat's runs any more: a renewal still in flight
        # after the run was finished or suspended would hold a released run's lease.
        self._stop.set()
        self._done.wait(timeout=self.ttl)

    def _loop(self) -> None:
        every = self.ttl / 3
        renew_at = time.monotonic() + every
        try:
            while not self._stop.wait(max(0.0, min(renew_at - time.monotonic(), self._next_report()))):
                self._announce_claim()
                self._report_progress()
                if time.monotonic() < renew_at:
                    continue
                started = time.monotonic()
                renew_at = started + every
                try:
                    renewal = systemdb.renew_lease(self.run_id, fence=self.fence, ttl=self.ttl)
                    if not renewal:
                        if self._stop.is_set():  # our own worker released the run meanwhile
                            return
                        self.lost = True
                        log.warning("run %s: heartbeat found the lease taken over", self.run_id)
                        return
                    note_success()
                    self.lease_until = started + self.ttl
                    if self._ctx is not None:
                        self._ctx.lease_until = self.lease_until
                        if renewal.paused:  # a step that runs long: the run stops after it
                            self._ctx.pause_requested = True
                except Exception as exc:  # try again soon; the lease may still hold
                    if not is_storage_error(exc):
                        log.exception("run %s: heartbeat failed", self.run_id)
                    note_failure(exc, doing="renewing leases")
                    connection.close()
                    renew_at = time.monotonic() + min(every, 0.5)
        finally:
            if connection.connection is not None:  # opened by a renewal: not kept between runs
                connection.close()
            self._done.set()


class _Keeper:
    """The thread that runs one worker thread's heartbeats, one run after another.

    A thread per run cost each run about 0.3 ms of wall time and 0.13 ms of CPU to start
    and join (measured in-process), a twentieth of a 20-step run's time; this thread is
    started once per worker thread and waits for the next run between runs."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._next: Heartbeat | None = None
        self._thread = threading.Thread(target=self._serve, name="heartbeat", daemon=True)
        self._thread.start()

    def serve(self, beat: Heartbeat) -> None:
        with self._ready:
            self._next = beat
            self._ready.notify()

    def _serve(self) -> None:
        while True:
            with self._ready:
                while self._next is None:
                    self._ready.wait()
                beat, self._next = self._next, None
            try:
                beat._loop()
            except BaseException:  # _loop catches what a renewal raises; this thread must outlive a bug
                log.exception("run %s: heartbeat stopped", beat.run_id)
                beat._done.set()


_keepers = threading.local()


def _keeper() -> _Keeper:
    """The calling thread's keeper (each worker thread advances one run at a time)."""
    keeper = getattr(_keepers, "keeper", None)
    if keeper is None or not keeper._thread.is_alive():  # none yet, or inherited from before a fork
        keeper = _keepers.keeper = _Keeper()
    return keeper

"""A worker process's threads: ``WorkerPool`` (N RQ workers, one thread each) and the
``BackgroundThread`` (registry beat and sweeper). The RQ workers are in ``sagas.runtime.rqworker``.

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

from django.conf import settings
from django.db import connection
from redis import Redis

from core.storage import is_storage_error, note_failure, note_success
from ledger.flow import pump
from sagas import services
from sagas.replay.context import shutdown_requested
from sagas.retention import archiving
from sagas.runtime import recovery
from sagas.runtime.identity import set_thread_worker_id
from sagas.runtime.rqworker import ThreadWorker
from sagas.schedules import firing

log = logging.getLogger("sagas.runtime.worker")

# Threads per process: each holds a database connection, plus one per run in
# progress for its lease heartbeat.
MAX_CONCURRENCY = 64


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
        if self.sweep:  # the scheduled retention pass, in a thread of its own (a pass may be long)
            archiving.ArchiveThread(stop=self.stop_event).start()
        FlowPumpThread(stop=self.stop_event).start()
        wait, beaten = self.interval, 0.0
        try:
            while not self.stop_event.wait(wait):
                wait = self.interval
                try:
                    if time.monotonic() - beaten >= 0.9 * self.interval:
                        self.beat()
                        beaten = time.monotonic()
                    note_success()  # "outage over" even when no job comes to say so
                    if self.sweep:
                        report = recovery.try_sweep_locked()
                        if report is not None and report.total:
                            log.info("sweep: %s", report)
                        # A schedule's tick due before the next sweep: fire it on time, whoever's
                        # turn the sweep is (firing skips the schedules another process holds).
                        due = firing.seconds_until_due()
                        if due is not None and due < self.interval:
                            if due == 0.0:
                                fired = firing.fire_due()
                                if fired.started:
                                    log.info("schedules: %s", fired)
                                due = firing.seconds_until_due()
                            if due is not None:
                                wait = max(0.05, min(self.interval, due + 0.01))
                except Exception as exc:
                    if is_storage_error(exc):  # one line per outage, not a traceback per pass
                        note_failure(exc, doing="sweeping")
                    else:
                        log.exception("background pass failed; retrying next interval")
                    connection.close()
        finally:
            connection.close()


class FlowPumpThread(threading.Thread):
    """Lets calls held by flow control go (``ledger.flow.pump``): every ``PUMP_INTERVAL`` while
    calls wait, every ``IDLE_INTERVAL`` otherwise. Every worker process runs one; they share the
    work bucket by bucket (``SKIP LOCKED``) and never let the same capacity go twice."""

    IDLE_INTERVAL = 0.5

    def __init__(self, *, stop: threading.Event) -> None:
        super().__init__(name="sagas-flow-pump", daemon=True)
        self.stop_event = stop

    def run(self) -> None:
        interval = self.IDLE_INTERVAL
        try:
            while not self.stop_event.wait(interval):
                try:
                    busy = bool(pump.buckets_with_work())
                    if busy:
                        pump.pump()
                    interval = pump.PUMP_INTERVAL if busy else self.IDLE_INTERVAL
                except Exception as exc:
                    if is_storage_error(exc):
                        note_failure(exc, doing="letting held calls go")
                    else:
                        log.exception("flow pump pass failed; retrying")
                    connection.close()
                    interval = self.IDLE_INTERVAL
        finally:
            connection.close()


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

"""The engine's worker: an RQ ``SimpleWorker`` plus a background sweeper.

Why ``SimpleWorker`` (no fork per job): the process that dequeues is the process
that runs the workflow code, so killing it kills the run's execution for
certain (RQ's forking worker leaves a child that survives a ``kill -9`` of its
parent). Recovery never depends on RQ noticing a dead worker: the run's lease
expires and the sweeper re-enqueues it. Forking also costs several
milliseconds per job, which a 20-step run cannot afford.

On SIGTERM/SIGINT the worker stops taking jobs, and a run in progress is handed
back (PENDING, re-enqueued) at its next step boundary instead of finishing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime

from django.conf import settings
from django.db import connection
from rq import SimpleWorker

from sagas import recovery, services
from sagas.context import shutdown_requested

log = logging.getLogger("sagas.worker")


class SagaWorker(SimpleWorker):
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
                    if self.sweep:
                        report = recovery.try_sweep_locked()
                        if report is not None and report.total:
                            log.info("sweep: %s", report)
                except Exception:
                    log.exception("background pass failed; retrying next interval")
                    connection.close()
        finally:
            connection.close()

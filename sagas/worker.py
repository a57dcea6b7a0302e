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
import threading

from django.conf import settings
from django.db import connection
from rq import SimpleWorker

from sagas import recovery
from sagas.context import shutdown_requested

log = logging.getLogger("sagas.worker")


class SagaWorker(SimpleWorker):
    def request_stop(self, signum, frame):  # type: ignore[no-untyped-def]
        shutdown_requested.set()
        return super().request_stop(signum, frame)


class SweeperThread(threading.Thread):
    """Runs a sweep every ``SAGAS_SWEEP_INTERVAL`` seconds (one process at a time, by advisory lock)."""

    def __init__(self, interval: float) -> None:
        super().__init__(name="sagas-sweeper", daemon=True)
        self.interval = interval
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            while not self.stop_event.wait(self.interval):
                try:
                    report = recovery.try_sweep_locked()
                    if report is not None and report.total:
                        log.info("sweep: %s", report)
                except Exception:
                    log.exception("sweep failed; retrying next interval")
                    connection.close()
        finally:
            connection.close()


def start_sweeper() -> SweeperThread:
    thread = SweeperThread(settings.SAGAS_SWEEP_INTERVAL)
    thread.start()
    return thread

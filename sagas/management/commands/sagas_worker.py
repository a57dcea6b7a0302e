from __future__ import annotations

import logging

from django.conf import settings
from django.core.management.base import BaseCommand

from sagas import queue, recovery, services
from sagas.engine import set_worker_id, worker_id
from sagas.worker import SagaWorker, start_sweeper

log = logging.getLogger("sagas.worker")


class Command(BaseCommand):
    help = "Run a worker that advances workflow runs from the engine's queue."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--burst", action="store_true", help="exit when the queue is empty")
        parser.add_argument("--no-sweep", action="store_true", help="do not run the sweeper in this worker")
        parser.add_argument("--name", default=None, help="worker name (default host:pid)")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        count = services.versions_sync_all()
        resumed = services.runs_resume_stranded()
        if options["name"]:
            set_worker_id(options["name"])
        name = worker_id()
        self.stdout.write(
            f"sagas worker {name}: {count} workflow version(s), queue {settings.SAGAS_QUEUE!r}, "
            f"lease {settings.SAGAS_LEASE_TTL:g}s, sweep every {settings.SAGAS_SWEEP_INTERVAL:g}s"
            + (f", resumed {len(resumed)} stranded run(s)" if resumed else "")
        )
        self.stdout.flush()
        sweeper = None
        if not options["no_sweep"]:
            if options["burst"]:
                recovery.try_sweep_locked()
            else:
                sweeper = start_sweeper()
        worker = SagaWorker([queue.get_queue()], connection=queue.redis_connection(), name=name)
        try:
            worker.work(burst=options["burst"], with_scheduler=False, logging_level="WARNING")
        finally:
            if sweeper is not None:
                sweeper.stop_event.set()

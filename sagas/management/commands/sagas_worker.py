from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser
from django.db import connection, connections
from django.utils import timezone

from core.commands import NoPageCommand
from core.storage import retry_storage
from ledger.flow import services as flow_services
from sagas import services
from sagas.runtime import dispatch, queue, readiness, recovery
from sagas.runtime.identity import set_worker_id, worker_id
from sagas.runtime.rqworker import SagaWorker
from sagas.runtime.worker import MAX_CONCURRENCY, BackgroundThread, WorkerPool
from sagas.schedules.services import schedules_sync
from sagas.versions import registry

log = logging.getLogger("sagas.runtime.worker")


class Command(NoPageCommand):
    help = "Run a worker that advances workflow runs of the versions it has registered."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--burst", action="store_true", help="exit when the queues are empty")
        parser.add_argument("--no-sweep", action="store_true", help="do not run the sweeper in this worker")
        parser.add_argument("--name", default=None, help="worker name, unique per process (default host:pid)")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="runs this process advances at once, one thread each (default: SAGAS_WORKER_CONCURRENCY, 1)",
        )
        parser.add_argument(
            "--ready-file",
            default=None,
            help=(
                "write this JSON file once registered and taking jobs; removed on a clean exit "
                "(sagas.runtime.readiness)"
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        concurrency = options["concurrency"]
        if concurrency is None:
            concurrency = settings.SAGAS_WORKER_CONCURRENCY
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise CommandError(f"--concurrency must be from 1 to {MAX_CONCURRENCY}, not {concurrency}")
        if options["name"]:
            set_worker_id(options["name"])
        name = worker_id()
        # Name this process's PostgreSQL sessions (pg_stat_activity.application_name), so an
        # operator can tell which worker holds which backend; every thread connects with it.
        connections.settings["default"].setdefault("OPTIONS", {})["application_name"] = f"sagas_worker {name}"[:63]
        connection.close()
        definitions = registry.all_definitions()
        background = BackgroundThread(name=name, started_at=timezone.now(), sweep=not options["no_sweep"])

        def register() -> list[str]:
            services.versions_sync_all()
            flow_services.sync_declared()  # the connectors' declared limits, unless staff changed them
            schedules_sync(declared=registry.declared_schedules())  # the schedules in @workflow
            background.beat()
            return services.runs_resume_stranded(hashes={h for d in definitions for h in d.accepted_hashes})

        # A worker started (or restarted by its supervisor) while PostgreSQL is away waits for
        # it, one log line per outage, instead of exiting and being restarted in a loop.
        resumed = retry_storage(register, doing="starting the worker")
        # Compensations first: undoing effects is rarer and more urgent than new work.
        queue_names = [
            queue.compensation_queue_name(),
            *queue.queue_names_for({h for d in definitions for h in d.accepted_hashes}),
        ]
        self.stdout.write(
            f"sagas worker {name}: {len(definitions)} workflow version(s) on {len(queue_names) - 1} queue(s) "
            f"and the compensation queue, "
            f"lease {settings.SAGAS_LEASE_TTL:g}s, sweep every {settings.SAGAS_SWEEP_INTERVAL:g}s"
            + (f", {concurrency} threads ({name}/1..{name}/{concurrency})" if concurrency > 1 else "")
            + (f", resumed {len(resumed)} stranded run(s)" if resumed else "")
        )
        self.stdout.flush()
        if not definitions:
            self.stderr.write("no workflows are registered: set SAGAS_MODULES or add workflows.py to an app")
            return
        dispatch.install_slots(concurrency)
        listener: dispatch.DispatchListener | None = None
        if options["burst"]:
            if not options["no_sweep"]:
                recovery.try_sweep_locked()
        else:
            background.start()
            if dispatch.enabled():  # runs made runnable reach an idle thread on their commit
                listener = dispatch.DispatchListener(
                    name=name, size=min(concurrency, settings.SAGAS_DISPATCH_THREADS), stop=background.stop_event,
                    hash_prefixes=frozenset(h[:16] for d in definitions for h in d.accepted_hashes),
                )
                listener.start()
        if options["ready_file"]:
            readiness.ready_file_write(options["ready_file"], name=name, started_at=background.started_at,
                                       definitions=definitions, concurrency=concurrency)
        if concurrency == 1:
            worker = SagaWorker(
                [queue.get_queue(n) for n in queue_names], connection=queue.redis_connection(), name=name
            )
            try:
                worker.work(burst=options["burst"], with_scheduler=False, logging_level="WARNING")
            finally:
                if options["ready_file"]:
                    readiness.ready_file_remove(options["ready_file"])
                background.stop_event.set()
                if listener is not None:  # a run a fast thread holds is handed back first
                    listener.drain(timeout=float(settings.SAGAS_LEASE_TTL))
                services.worker_stopped(name=name)
            return
        pool = WorkerPool(
            name=name, queue_names=queue_names, connection=queue.redis_connection(),
            concurrency=concurrency, burst=options["burst"],
        )
        try:
            clean = pool.run()
        finally:
            if options["ready_file"]:
                readiness.ready_file_remove(options["ready_file"])
            background.stop_event.set()
            if listener is not None:
                listener.drain(timeout=float(settings.SAGAS_LEASE_TTL))
            services.worker_stopped(name=name)
        if not clean:
            raise CommandError(f"a worker thread of {name} stopped on an error; see the log above")

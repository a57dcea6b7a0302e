from __future__ import annotations

import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection

from sagas import recovery


class Command(BaseCommand):
    help = "Re-enqueue runs whose lease expired or whose wake-up was lost. PostgreSQL is the truth."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--loop", action="store_true", help="keep sweeping until SIGTERM/SIGINT")
        parser.add_argument("--interval", type=float, default=None, help="seconds between passes")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        interval = options["interval"] or settings.SAGAS_SWEEP_INTERVAL
        stop = threading.Event()
        if options["loop"]:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
        passes = 0
        while True:
            try:
                report = recovery.sweep()
                passes += 1
                if not options["loop"] or report.total:
                    self.stdout.write(f"sweep #{passes}: {report}")
                    self.stdout.flush()
            except Exception as exc:  # keep looping: a DB or Redis blip must not stop recovery
                self.stderr.write(f"sweep #{passes + 1} failed: {exc}")
                connection.close()
            if not options["loop"] or stop.wait(interval):
                break
        if options["loop"]:
            self.stdout.write(f"sweeper stopped after {passes} pass(es)")

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand
from django.db import connection

from ledger.reconcile import reconcile_due


class Command(BaseCommand):
    help = "Re-query UNKNOWN effects whose connector has a lookup, with back-off, and resolve them."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--loop", action="store_true", help="keep reconciling until SIGTERM/SIGINT")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        stop = threading.Event()
        if options["loop"]:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
        passes = 0
        while True:
            try:
                report = reconcile_due()
                passes += 1
                if not options["loop"] or report.checked:
                    self.stdout.write(f"reconcile #{passes}: {report}")
                    self.stdout.flush()
            except Exception as exc:  # keep going: a provider or DB blip must not stop reconciliation
                self.stderr.write(f"reconcile #{passes + 1} failed: {exc}")
                connection.close()
            if not options["loop"] or stop.wait(options["interval"]):
                break
        if options["loop"]:
            self.stdout.write(f"reconciler stopped after {passes} pass(es)")

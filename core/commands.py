"""Bases for the management commands of processes that serve no page.

``NoPageCommand``: the system checks such a command runs at start-up. ``PassLoopCommand``: a
command that runs one pass, or keeps running passes until told to stop.

The sweeper (``sagas_sweep``) and the reconciler (``ledger_reconcile``) share this
shape: a pass that must never be stopped by a passing database, Redis or provider
error, a one-line report when the pass did something, and a clean exit on SIGTERM
or SIGINT between passes.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from django.core.checks import Tags
from django.core.checks.registry import registry
from django.core.management.base import BaseCommand, CommandParser
from django.db import connection

from core.storage import Backoff, is_storage_error, note_failure, note_success


class NoPageCommand(BaseCommand):
    """A command whose process serves no page (a worker, the sweeper, the reconciler, the
    providers, a maintenance command). Before it runs, every registered system check runs but
    those tagged ``urls``. Django runs every check before a command by default, and the URL
    check imports the whole URL configuration, the console's views and the HTTP API with its
    pydantic schemas: 0.65 of the 1.24 CPU-s a worker spent from its start to its ready file
    (cProfile, a warm machine). ``manage.py check``, ``migrate`` and ``runserver`` still check
    the URLs.
    """

    def get_check_kwargs(self, options: dict[str, Any]) -> dict[str | None, Any]:
        return {"tags": sorted(tag for tag in registry.tags_available() if tag != Tags.urls)}


class PassLoopCommand(NoPageCommand):
    label = "pass"  # "sweep #3: ...", "reconciler stopped after ..."
    stopped_label = "loop"
    default_interval = 1.0

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true", help="keep running passes until SIGTERM/SIGINT")
        parser.add_argument("--interval", type=float, default=None, help="seconds between passes")

    def run_pass(self) -> tuple[Any, bool]:
        """One pass: its report, and whether it did anything worth a line in a loop."""
        raise NotImplementedError

    def interval(self) -> float:
        return self.default_interval

    def wait_before_next(self, interval: float) -> float:
        """Seconds to wait before the next pass (``interval`` unless the command knows of work
        due sooner)."""
        return interval

    def _next_wait(self, interval: float) -> float:
        try:
            return self.wait_before_next(interval)
        except Exception:  # noqa: BLE001  (a storage blip: the next pass says so)
            return interval

    def handle(self, *args: Any, **options: Any) -> None:
        interval = options["interval"] or self.interval()
        stop = threading.Event()
        if options["loop"]:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: stop.set())
        passes = 0
        backoff = Backoff()
        while True:
            try:
                report, eventful = self.run_pass()
                passes += 1
                if not options["loop"] or eventful:
                    self.stdout.write(f"{self.label} #{passes}: {report}")
                    self.stdout.flush()
            except Exception as exc:  # keep looping: a blip must not stop recovery
                if is_storage_error(exc) and options["loop"]:
                    # One line when the outage starts and one when it ends; retry sooner
                    # than the interval (backing off), so recovery resumes quickly.
                    note_failure(exc, doing=self.label)
                    if not backoff.sleep(stop, until=time.monotonic() + interval):
                        break
                    continue
                self.stderr.write(f"{self.label} #{passes + 1} failed: {exc}")
                connection.close()
            else:
                backoff = Backoff()
                note_success()
            if not options["loop"] or stop.wait(self._next_wait(interval)):
                break
        if options["loop"]:
            self.stdout.write(f"{self.stopped_label} stopped after {passes} pass(es)")

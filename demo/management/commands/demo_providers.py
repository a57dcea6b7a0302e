"""``manage.py demo_providers``: serve the simulated providers until SIGTERM or SIGINT."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError, connection

from core.commands import NoPageCommand
from demo.models import ProviderExecution
from demo.providers.server import ProviderServer


class Command(NoPageCommand):
    help = "Serve the simulated payment, inventory, email and shipping providers over HTTP (JSON)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            ProviderExecution.objects.exists()
        except DatabaseError as exc:
            raise CommandError(f"the providers' tables are not usable (run manage.py migrate): {exc}") from exc
        finally:
            connection.close()
        try:
            server = ProviderServer((options["host"], options["port"]))
        except OSError as exc:
            raise CommandError(f"cannot listen on {options['host']}:{options['port']}: {exc}") from exc

        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        thread.start()
        host, port = server.socket.getsockname()[:2]
        self.stdout.write(f"demo providers listening on http://{host}:{port}")
        self.stdout.flush()
        while not stop.wait(0.5):
            pass
        server.shutdown()
        server.server_close()
        self.stdout.write(f"demo providers stopped after {server.requests_served} request(s)")

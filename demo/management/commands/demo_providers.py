"""``manage.py demo_providers``: serve the simulated providers until SIGTERM or SIGINT."""

from __future__ import annotations

import signal
import threading
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections

from core.commands import NoPageCommand
from demo.models import ProviderExecution
from demo.providers.server import ProviderServer


class Command(NoPageCommand):
    help = "Serve the simulated payment, inventory, email and shipping providers over HTTP (JSON)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8765, help="0 picks a free port (printed)")

    def handle(self, *args: Any, **options: Any) -> None:
        _pool_connections()
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


# Connections the request threads share when the process has no pool of its own (DB_POOL_SIZE).
POOL_SIZE = 8


def _pool_connections() -> None:
    """Serve every request from a pool of connections. Each request runs on a thread of its own,
    which closes its connections when it ends (``ProviderServer``): without a pool, every provider
    call started a PostgreSQL backend (a fork and a login), which was a third of the CPU a
    1,000-run load with two effects a run cost (tests/faults/test_failover.py: 97 against 66
    CPU-seconds). Set before the first connection of any thread: each thread's connection is made
    from this same settings dict."""
    db = connections.settings[DEFAULT_DB_ALIAS]
    options = db.setdefault("OPTIONS", {})
    if "pool" not in options:
        options["pool"] = {"min_size": 1, "max_size": POOL_SIZE, "timeout": 10}
        db["CONN_MAX_AGE"] = 0  # a pooled connection goes back to the pool when the request ends


from __future__ import annotations

import socket

import pytest

from tests.procs import wait_until, worker_env

MODULES = "tests.ledger.wf_orders"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """Providers (a real HTTP process) plus helpers to start workers pointed at them."""

    def __init__(self, procs, url: str) -> None:
        self.procs, self.url = procs, url

    def worker(self, name: str, *args: str, **env: str):
        return self.procs.worker(name, MODULES, *args, DEMO_PROVIDERS_URL=self.url, **env)


@pytest.fixture
def stack(procs, transactional_db, settings):
    port = _free_port()
    server = procs.start("providers", ["manage.py", "demo_providers", "--port", str(port)], worker_env(""))
    wait_until(lambda: "listening" in server.log().lower(), 20, what="the provider server to listen")
    url = f"http://127.0.0.1:{port}"
    settings.DEMO_PROVIDERS_URL = url
    return Stack(procs, url)

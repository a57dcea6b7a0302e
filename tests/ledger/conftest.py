from __future__ import annotations

import re

import pytest

from tests.procs import wait_until, worker_env

MODULES = "tests.ledger.wf_orders"


class Stack:
    """Providers (a real HTTP process) plus helpers to start workers pointed at them."""

    def __init__(self, procs, url: str) -> None:
        self.procs, self.url = procs, url

    def worker(self, name: str, *args: str, **env: str):
        return self.procs.worker(name, MODULES, *args, DEMO_PROVIDERS_URL=self.url, **env)


@pytest.fixture
def stack(procs, transactional_db, settings):
    # --port 0: the server picks a free port and prints it (no race with other suites).
    server = procs.start("providers", ["manage.py", "demo_providers", "--port", "0"], worker_env(""))
    found = wait_until(
        lambda: re.search(r"listening on (http://\S+)", server.log()) or not server.alive(), 20,
        what="the provider server to listen",
    )
    assert server.alive(), server.log()
    url = found.group(1)
    settings.DEMO_PROVIDERS_URL = url
    return Stack(procs, url)
